"""How much slower this machine runs now than the quiet 2-core machine the suite's timeouts were
written on: a pure-Python loop timed a few times, and the load average per core. The suite's
hang guards (conftest.SLOWDOWN) are multiplied by it, so a busy machine gets longer to finish
what a quiet one does, instead of failing on load alone (a timeout guards a hang, not a speed).

`python3 tests/pace.py` prints the factor and what it came from; .ci/run measures it once at the
start, hands it to both pytest processes as TEAM_TEST_PACE and prints it in its summary."""
import os
import statistics
import sys
import time

# The loop's time on the reference machine, quiet: a 2-core Intel Xeon of this project's CI kind,
# 2026-12-07 (fastest of 15 runs: 0.044 s). A slower CPU (the AMD EPYC kind) then reads as a
# factor above 1 too, which only lengthens the guards.
REFERENCE_S = 0.045
# At least this long: a shorter sample can run on a core the scheduler hands a new process for a
# moment, and miss two busy loops started beside it (0.4 s read pace 1.00 under them).
WINDOW_S = 1.5


def loop_seconds():
    start = time.perf_counter()
    sum(i * i for i in range(1_000_000))
    return time.perf_counter() - start


def measure():
    """(factor >= 1, a one-line account of it). Loops for WINDOW_S: their median time shows a
    slower or shared CPU, the share of the wall time this process got the CPU shows sharing
    directly, and the load average per core shows it for work that uses every core (a training
    run), which one loop on one core may not (it lags by a minute)."""
    times, start, cpu = [], time.perf_counter(), time.process_time()
    while time.perf_counter() - start < WINDOW_S:
        times.append(loop_seconds())
    share = (time.process_time() - cpu) / (time.perf_counter() - start)
    median = statistics.median(times)
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    factor = max(1.0, median / REFERENCE_S, 1 / max(share, 0.05), load)
    return factor, (f"pace {factor:.2f}: the timeouts that guard hangs are {factor:.2f}x the quiet machine's "
                    f"(loop {median * 1000:.0f} ms against {REFERENCE_S * 1000:.0f} ms there; CPU share "
                    f"{share:.2f}; load {load:.2f} per core)")


def factor():
    """TEAM_TEST_PACE when the run measured it already (.ci/run), else measured now."""
    given = os.environ.get("TEAM_TEST_PACE")
    if given:
        try:
            return max(1.0, float(given))
        except ValueError:
            sys.exit(f"TEAM_TEST_PACE={given!r} is not a number (it is .ci/run's measure of this "
                     "machine's pace, e.g. 1.4: unset it to measure again)")
    return measure()[0]


if __name__ == "__main__":
    value, account = measure()
    print(f"{value:.2f}" if sys.argv[1:] == ["--factor"] else account)
