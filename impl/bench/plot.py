"""The log-log plot of a record (``--plot FILE.png``); matplotlib is imported only when plotting."""

from __future__ import annotations

from typing import Any


def plot(record: dict[str, Any], path: str) -> None:
    """Log-log time against n for each implementation and the sgemm floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name in record["config"]["implementations"]:
        pts = [(r["n_tokens"], r["time_s"]) for r in record["results"]
               if r["implementation"] == name and r["time_s"]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ns = [f["n_tokens"] for f in record["floor"]]
    # The floor is a fixed rate times the n² FLOPs: it doubles as the slope-2 guide.
    ax.plot(ns, [f["time_s"] for f in record["floor"]], "k--", label="sgemm floor (∝ n²)")
    mode = record["config"].get("mode", "forward")
    ax.set(xscale="log", yscale="log", xlabel="tokens n", ylabel="seconds (median)",
           title=f"{mode}, one head, float32, d_k = {record['config']['d_k']}"
           + (", causal" if record["config"]["causal"] else ""))
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
