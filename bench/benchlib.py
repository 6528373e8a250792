"""Shared by the bench scripts: event timing for the torch peers and reading JSON result lines."""
import json
import statistics



def median_ms(fn, reps=50, warmup=10):
    """Median milliseconds of fn() over `reps` event-timed calls after `warmup` untimed ones."""
    import torch  # here, so that the compare scripts run without torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def json_rows(path):
    """The JSON objects printed one per line in a bench log (other lines are skipped)."""
    out = []
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out
