from nbddp.orchestration.plots import plot_loss_panels


def png_size(path):
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def test_one_png_with_a_panel_per_case(tmp_path):
    one = plot_loss_panels([("a", {"now": [(1, 2.0), (2, 1.0)]})], tmp_path / "one.png")
    panels = [("a", {"baseline": [(1, 2.0), (2, 1.0)], "now": [(1, 2.1), (2, 0.9)]}), ("b", {"now": [], "x": [(1, 1)]})]
    two = plot_loss_panels(panels, tmp_path / "two.png")
    assert png_size(two)[1] > png_size(one)[1]  # panels stack vertically
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.png", "two.png"]


def test_a_panel_without_losses_says_so_and_warns_of_nothing(tmp_path, recwarn):
    from matplotlib import pyplot

    drawn = []
    real_text = pyplot.Axes.text

    def text(axis, x, y, s, *args, **kwargs):
        drawn.append(s)
        return real_text(axis, x, y, s, *args, **kwargs)

    pyplot.Axes.text = text
    try:
        plot_loss_panels([("a", {"train loss": [], "held-out loss": []})], tmp_path / "empty.png")
    finally:
        pyplot.Axes.text = real_text
    assert drawn == ["no losses recorded"]
    assert png_size(tmp_path / "empty.png")[0] > 0
    assert not [w for w in recwarn if "legend" in str(w.message)]
