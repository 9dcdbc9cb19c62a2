"""Loss-curve PNGs (matplotlib's Agg backend: no display needed, nothing imported until a plot is drawn)."""

from nbddp.orchestration.project.files import replacing


def plot_loss_panels(panels, path, markers=()):
    """Write `path`: one panel per `(title, {label: [(step, loss), ...]})`, one line per label; the labels in
    `markers` (held-out losses, measured every so many steps) as points, not a line between the measurements. The
    loss axis is logarithmic when every loss is above 0: a loss falls by orders of magnitude early and little late,
    which a linear axis squeezes into its bottom. A panel with no losses says so in its middle."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    figure, axes = pyplot.subplots(len(panels), 1, figsize=(7, 3 * len(panels)), squeeze=False)
    for axis, (title, curves) in zip(axes[:, 0], panels):
        for order, (label, points) in enumerate(curves.items()):
            if points and label in markers:
                axis.plot(*zip(*points), linestyle="none", marker="D", markersize=6, label=label)
            elif points:
                steps, losses = zip(*points)
                # Wide and faint first, so an identical second curve on top of it stays visible.
                width, alpha = (4, 0.4) if order == 0 else (1.5, 1.0)
                axis.plot(steps, losses, linewidth=width, alpha=alpha, marker="o" if len(points) < 30 else None,
                          markersize=3, label=label)
        if all(loss > 0 for points in curves.values() for _, loss in points) and any(curves.values()):
            axis.set_yscale("log")
            plain = FuncFormatter(lambda value, _: f"{value:g}")  # 3, not 3x10^0
            axis.yaxis.set_major_formatter(plain)
            axis.yaxis.set_minor_formatter(plain)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("step")
        axis.set_ylabel("loss")
        axis.grid(alpha=0.3)
        if any(curves.values()):
            axis.legend()
        else:
            axis.text(0.5, 0.5, "no losses recorded", ha="center", va="center", transform=axis.transAxes)
    figure.tight_layout()
    with replacing(path) as temp:
        figure.savefig(temp, format="png", dpi=100)
    pyplot.close(figure)
    return path
