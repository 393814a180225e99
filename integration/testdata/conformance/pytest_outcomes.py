# Runs pytest as "python3 -m pytest ARGS" does, given a timeout in seconds
# and a file of ARGS, one a line, and writes each test's outcome to file
# descriptor 3 as soon as it is known, in outcomes.py's lines:
#
#     \x1eflmbox-conformance {"id": ..., "outcome": ..., "detail": ...}
#
# The id is pytest's node id (numpy/core/tests/test_x.py::TestC::test_a[1]
# under --rootdir /usr/lib/python3/dist-packages). Each test is "started"
# first; then its outcome: passed, failed (its call failed), error (its
# setup or teardown failed, or its module could not be collected), skipped,
# xfail (an expected failure) or xpass (an unexpected success); a test
# reported more than once keeps the worst. Once the timeout has passed,
# faulthandler prints every thread's stack and the run exits, as regrtest's
# --timeout does: the test then running stays "started".
#
# Used by integration/conformance_test.go, on both sides of its comparison.
import faulthandler
import json
import os
import sys

import pytest

MARKER = "\x1eflmbox-conformance "

out = os.fdopen(3, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
os.set_inheritable(3, False)


def record(nodeid, outcome, detail=""):
    line = json.dumps({"id": nodeid, "outcome": outcome, "detail": detail[:400]})
    out.write(MARKER + line + "\n")


def summary(report):
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[-1] if crash.message.strip() else ""
    lines = str(longrepr).strip().splitlines()
    return lines[-1] if lines else ""


class Recorder:
    def pytest_runtest_logstart(self, nodeid, location):
        record(nodeid, "started")

    def pytest_runtest_logreport(self, report):
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if report.passed:
                record(report.nodeid, "xpass" if xfail else "passed")
            elif report.skipped:
                record(report.nodeid, "xfail" if xfail else "skipped", summary(report))
            else:
                record(report.nodeid, "failed", summary(report))
        elif report.failed:  # setup or teardown
            record(report.nodeid, "error", report.when + ": " + summary(report))
        elif report.skipped:  # a skip mark, or a skip in a fixture
            record(report.nodeid, "xfail" if xfail else "skipped", summary(report))

    def pytest_collectreport(self, report):
        if report.failed:
            record(report.nodeid, "error", "collect: " + summary(report))


timeout = int(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    args = [line.rstrip("\n") for line in f if line.strip()]
faulthandler.dump_traceback_later(timeout, exit=True)
sys.exit(pytest.main(args, plugins=[Recorder()]))
