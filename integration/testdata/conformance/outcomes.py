# Runs CPython's regression tests as "python3 -m test ARGS" does (the same
# regrtest, the same __main__), given ARGS, and writes each test's outcome
# to file descriptor 3 as soon as it is known, one line each:
#
#     \x1eflmbox-conformance {"id": ..., "outcome": ..., "detail": ...}
#
# so that what ran before a crash or a kill is still known, and which test
# was running then: each test is "started" first. Outcomes: passed, failed,
# error, skipped, xfail (an expected failure) and xpass (an unexpected
# success). A subtest's outcome is its test's; an error (or skip)
# of a class's or module's fixture is recorded under the name unittest gives
# it, "setUpClass (test.test_x.Class)". Only the recording is added:
# regrtest's own result class is wrapped, not replaced.
#
# Used by integration/conformance_test.go, on both sides of its comparison.
import json
import os
import runpy
import traceback
import unittest

from test.support import testresult

MARKER = "\x1eflmbox-conformance "

out = os.fdopen(3, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
os.set_inheritable(3, False)


def record(test, outcome, detail=""):
    if isinstance(test, unittest.case._SubTest):
        test = test.test_case
    try:
        test_id = test.id()
    except Exception:
        test_id = str(test)
    line = json.dumps({"id": test_id, "outcome": outcome, "detail": detail[:400]})
    out.write(MARKER + line + "\n")


def summary(err):
    lines = traceback.format_exception_only(err[0], err[1])
    return lines[-1].strip() if lines else ""


def add_sub_test(test, subtest, err):
    if err is not None:
        kind = "failed" if issubclass(err[0], test.failureException) else "error"
        record(test, kind, subtest._subDescription() + ": " + summary(err))


hooks = {
    "startTest": lambda test: record(test, "started"),
    "addSuccess": lambda test: record(test, "passed"),
    "addFailure": lambda test, err: record(test, "failed", summary(err)),
    "addError": lambda test, err: record(test, "error", summary(err)),
    "addSkip": lambda test, reason: record(test, "skipped", str(reason)),
    "addExpectedFailure": lambda test, err: record(test, "xfail"),
    "addUnexpectedSuccess": lambda test: record(test, "xpass"),
    "addSubTest": add_sub_test,
}


def wrap(name, hook):
    original = getattr(testresult.RegressionTestResult, name)

    def method(self, *args):
        hook(*args)
        return original(self, *args)

    setattr(testresult.RegressionTestResult, name, method)


for name, hook in hooks.items():
    wrap(name, hook)

runpy.run_module("test", run_name="__main__", alter_sys=True)
