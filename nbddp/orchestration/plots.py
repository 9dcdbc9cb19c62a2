"""Loss-curve PNGs (matplotlib's Agg backend: no display needed, nothing imported until a plot is drawn)."""

from nbddp.orchestration.files import replacing


def plot_loss_panels(panels, path):
    """Write `path`: one panel per `(title, {label: [(step, loss), ...]})`, one line per label."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import MaxNLocator

    figure, axes = pyplot.subplots(len(panels), 1, figsize=(7, 3 * len(panels)), squeeze=False)
    for axis, (title, curves) in zip(axes[:, 0], panels):
        for order, (label, points) in enumerate(curves.items()):
            if points:
                steps, losses = zip(*points)
                # Wide and faint first, so an identical second curve on top of it stays visible.
                width, alpha = (4, 0.4) if order == 0 else (1.5, 1.0)
                axis.plot(steps, losses, linewidth=width, alpha=alpha, marker="o" if len(points) < 30 else None,
                          markersize=3, label=label)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.set_ylabel("loss")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    with replacing(path) as temp:
        figure.savefig(temp, format="png", dpi=100)
    pyplot.close(figure)
    return path
