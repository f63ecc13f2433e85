"""The loss-curve figure that the example scripts write into their output folder."""


def save_loss_curve(log_history: list[dict], path: str, ylabel: str = "cross-entropy loss") -> None:
    """
    Plot training loss against optimizer step, with evaluation-loss points, from `trainer.state.log_history`.

    Args:
        log_history: `Trainer.state.log_history` (dicts with `step` and `loss` or `eval_loss`).
        path: the PNG file to write.
        ylabel: the y-axis label.
    """
    from matplotlib.figure import Figure  # the object-oriented API needs no pyplot state nor display backend

    train = [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry]
    evals = [(entry["step"], entry["eval_loss"]) for entry in log_history if "eval_loss" in entry]
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.subplots()
    if train:
        axes.plot(*zip(*train, strict=True), label="training loss")
    if evals:
        axes.plot(*zip(*evals, strict=True), "o--", label="evaluation loss")
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if train or evals:
        axes.legend()
    figure.savefig(path, dpi=120)
