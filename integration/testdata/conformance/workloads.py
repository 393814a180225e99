# A data-science agent's workloads (issue 39), each a test: run as a Python
# snippet under flmbox (flmbox run --language python) and as python3 -c
# under bare runsc, it prints each workload's outcome as outcomes.py does:
#
#     \x1eflmbox-conformance {"id": "workloads.NAME", "outcome": ..., "detail": ...}
#
# "started" first, then passed (the detail says how long it took, and what
# it measured), failed (an assertion, or anything on stderr: a warning of
# a worker or of a resource tracker fails a workload that gave the right
# answer) or error (another exception); and, after the last, the line that
# says the run finished. What is run is prepended: ONLY, the names of the
# workloads to run (all if empty), and TIMEOUT, in seconds, after which
# faulthandler prints every thread's stack and the run exits.
#
# Used by integration/conformance_test.go, on both sides of its comparison.
import faulthandler
import json
import os
import sys
import tempfile
import time
import traceback

MARKER = "\x1eflmbox-conformance "
EXIT_MARKER = "\x1eflmbox-conformance-exit "
WORKLOADS = []


def record(name, outcome, detail=""):
    line = json.dumps({"id": "workloads." + name, "outcome": outcome, "detail": detail[:400]})
    sys.stdout.write(MARKER + line + "\n")
    sys.stdout.flush()


def workload(fn):
    WORKLOADS.append(fn)
    return fn


def pool_workload(method):
    # A pool of 2 workers of the start method: the workers import numpy to
    # unpickle what they are sent, and say with which flags their Python
    # runs (a worker is an ordinary python3: site on, as for python3 -c).
    import multiprocessing
    import numpy

    ctx = multiprocessing.get_context(method)
    mats = [numpy.eye(3) * i for i in range(1, 9)]
    with ctx.Pool(2) as pool:
        dets = pool.map(numpy.linalg.det, mats)
        flags = pool.apply(eval, ("(__import__('sys').flags.no_site, __import__('sys').flags.no_user_site)",))
        pids = set(pool.map(eval, ["__import__('os').getpid()"] * 8, chunksize=1))
    assert [round(d) for d in dets] == [i**3 for i in range(1, 9)], dets
    assert flags == (0, 0), "a %s worker runs with no_site, no_user_site = %s" % (method, flags)
    return "%d workers" % len(pids)


@workload
def multiprocessing_spawn_pool():
    return pool_workload("spawn")


@workload
def multiprocessing_forkserver_pool():
    return pool_workload("forkserver")


@workload
def sklearn_gridsearch_loky():
    # joblib's loky backend: 2 worker processes and its resource tracker.
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = make_classification(n_samples=400, n_features=12, random_state=0)
    search = GridSearchCV(SVC(), {"C": [0.1, 1, 10], "gamma": ["scale", 0.01, 0.1]}, cv=3, n_jobs=2)
    search.fit(X, y)
    assert search.best_score_ > 0.8, search.best_score_
    return "best %s" % search.best_params_


@workload
def matplotlib_savefig():
    # The Agg backend, as a headless snippet has it, a PNG written to /tmp;
    # matplotlib's font cache goes under HOME (/tmp on both sides).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy

    x = numpy.linspace(0, 10, 200)
    fig, ax = plt.subplots()
    ax.plot(x, numpy.sin(x), label="sin")
    ax.legend()
    path = os.path.join(tempfile.mkdtemp(prefix="plot-", dir="/tmp"), "plot.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    with open(path, "rb") as f:
        head = f.read(8)
    size = os.path.getsize(path)
    assert head == b"\x89PNG\r\n\x1a\n" and size > 5000, (head, size)
    return "%d bytes" % size


@workload
def openblas_svd():
    # An SVD of 1000x1000 by OpenBLAS, with as many threads as it sees
    # CPUs: the detail says how many, and how long it took.
    import numpy
    import threadpoolctl

    blas = [p for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
    assert blas and blas[0]["internal_api"] == "openblas", blas
    a = numpy.random.default_rng(0).standard_normal((1000, 1000))
    start = time.perf_counter()
    u, s, vt = numpy.linalg.svd(a)
    took = time.perf_counter() - start
    assert numpy.allclose((u * s) @ vt, a)
    return "svd %.2fs, openblas %d threads, os.cpu_count() %s" % (took, blas[0]["num_threads"], os.cpu_count())


def run(fn):
    # Everything written to file descriptor 2 during the workload, by it or
    # by a process it started, goes to a file, read afterwards.
    record(fn.__name__, "started")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as err:
        os.dup2(err.fileno(), 2)
        start = time.perf_counter()
        try:
            what = fn()
            outcome, detail = "passed", ""
        except AssertionError as e:
            outcome, detail = "failed", "AssertionError: %s" % e
        except Exception:
            outcome, detail = "error", traceback.format_exc().strip().splitlines()[-1]
        took = time.perf_counter() - start
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace").strip()
    if stderr:
        sys.stderr.write(stderr + "\n")
        if outcome == "passed":
            lines = stderr.splitlines()
            outcome, detail = "failed", "on stderr (%d lines): %s" % (len(lines), " | ".join(lines[-3:]))
    if outcome == "passed":
        detail = "%.1fs: %s" % (took, what)
    record(fn.__name__, outcome, detail)


faulthandler.dump_traceback_later(TIMEOUT, exit=True)  # noqa: F821 (prepended)
for fn in WORKLOADS:
    if not ONLY or fn.__name__ in ONLY:  # noqa: F821 (prepended)
        run(fn)
faulthandler.cancel_dump_traceback_later()
sys.stdout.write(EXIT_MARKER + "0\n")
sys.stdout.flush()
