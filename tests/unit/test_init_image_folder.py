"""`unlearn init --dataset image_folder` reads the images: image_size and grayscale come from the files (the
most common size of a sample), and `--arch` takes every architecture; a CNN then trains on the folder without a
hand edit."""

from __future__ import annotations

import numpy as np
import pytest

from flows.cli import main
from flows.scaffold import ScaffoldError, read_image_format, scaffold
from unlearning.config import load_params


def png_folder(root, n_per_class=6, size=(32, 32), mode="RGB", classes=("cat", "dog")):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n_per_class):
            shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
            pixels = rng.integers(0, 128, shape) + 127 * c  # the classes differ in brightness
            Image.fromarray(pixels.astype(np.uint8), mode).save(root / name / f"{i:03d}.png")
    return root


def test_init_reads_32x32_rgb_and_writes_it(tmp_path, capsys):
    images = png_folder(tmp_path / "proj" / "images")
    assert main(["init", str(tmp_path / "proj"), "--dataset", "image_folder", "--path", str(images), "--arch", "cnn",
                 "--no-vcs"]) == 0
    out = capsys.readouterr().out
    assert "images: read 12 of 12: 12 are 32x32 (width x height), 12 color and 0 gray -> image_size [32, 32], " \
           "grayscale false" in out
    params = load_params(tmp_path / "proj" / "params.yaml")
    assert list(params.prepare.image_folder.image_size) == [32, 32] and params.prepare.image_folder.grayscale is False
    assert params.train.model.arch == "cnn" and params.train.model.channels == [8, 16]  # the rest as in params.yaml


def test_the_majority_size_and_mode_win_and_large_images_are_capped(tmp_path):
    folder = png_folder(tmp_path / "a", n_per_class=3, size=(40, 30), mode="L")
    png_folder(tmp_path / "a", n_per_class=1, size=(32, 32), mode="RGB", classes=("odd",))
    fmt, line = read_image_format(folder)
    assert fmt == {"image_size": [30, 40], "grayscale": True} and "1 other size(s)" in line
    big, line = read_image_format(png_folder(tmp_path / "b", n_per_class=1, size=(256, 128)))
    assert big["image_size"] == [32, 64] and "resized to a longest side of 64" in line
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    assert read_image_format(tmp_path / "empty")[0] == {}


@pytest.mark.parametrize("arch", ["mlp", "resnet"])
def test_every_architecture_is_accepted(tmp_path, arch):
    images = png_folder(tmp_path / "p" / "images", n_per_class=1)
    scaffold(tmp_path / "p", "image_folder", images, arch=arch, vcs=False)
    assert load_params(tmp_path / "p" / "params.yaml").train.model.arch == arch


def test_a_convolutional_arch_on_a_table_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("id,x,y\n1,0.5,a\n2,0.1,b\n")
    with pytest.raises(ScaffoldError, match="--arch cnn is convolutional: it needs images"):
        scaffold(tmp_path / "p", "table", tmp_path / "t.csv", id_column="id", label_column="y", arch="cnn", vcs=False)
    with pytest.raises(SystemExit):
        main(["init", str(tmp_path / "q"), "--dataset", "table", "--path", "t.csv", "--arch", "vit"])


def test_the_cnn_trains_on_the_folder_without_a_hand_edit(tmp_path):
    """prepare + train the original with the scaffolded params (epochs lowered: the test's time, not a hand edit
    of the data or model keys)."""
    import yaml

    from tasks.training import prepare_dataset, train_original
    from unlearning.data import load_prepared

    images = png_folder(tmp_path / "proj" / "images", n_per_class=10)
    scaffold(tmp_path / "proj", "image_folder", images, arch="cnn", vcs=False)
    path = tmp_path / "proj" / "params.yaml"
    data = yaml.safe_load(path.read_text())
    data["train"]["epochs"] = 15
    path.write_text(yaml.safe_dump(data))
    params = load_params(path)
    prepare_dataset.fn(params)
    prepared = load_prepared(params.path("prepared_dir"))
    assert list(prepared.info["in_shape"]) == [3, 32, 32]
    model, metrics = train_original.fn(params, prepared, "cpu")
    assert metrics["train_accuracy"] == 1.0 and metrics["val_accuracy"] >= 0.75, metrics  # bright vs dark
