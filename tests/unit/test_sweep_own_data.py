"""Own-data inputs no other test covers (found by running scaffolded projects on generated tables)."""

from __future__ import annotations

import datetime
import decimal
import re

import numpy as np
import pandas as pd
import pytest

from unlearning.data.registry import DataError
from unlearning.data.sources import load_table


def _table(n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    y = np.arange(n) % 2
    return pd.DataFrame({"id": [f"r{i}" for i in range(n)], "x": rng.normal(size=n) + y, "label": y})


def test_parquet_decimal_column_is_a_number_not_a_category(tmp_path):
    # A database's NUMERIC column arrives from Parquet as Decimal objects: it was one-hot encoded as text (or,
    # with many distinct values, refused as "text feature column ... identifies rows").
    df = _table()
    df["price"] = [decimal.Decimal(f"{i}.25") for i in range(len(df))]
    df.to_parquet(tmp_path / "t.parquet", index=False)
    ds = load_table(path=tmp_path / "t.parquet", id_column="id", label_column="label")
    names = ds.meta["preprocessing"]["feature_names"]
    assert names == ["x", "price"]
    col = ds.X[:, 1]
    assert np.isfinite(col).all() and len(np.unique(col)) == len(df)  # standardized, one value per row


def test_parquet_decimal_with_gaps_is_dropped_like_a_number(tmp_path):
    df = _table()
    df["price"] = [decimal.Decimal("1.5") if i % 10 else None for i in range(len(df))]
    df.to_parquet(tmp_path / "t.parquet", index=False)
    ds = load_table(path=tmp_path / "t.parquet", id_column="id", label_column="label", missing="drop")
    assert ds.meta["preprocessing"]["feature_names"] == ["x", "price"]
    assert len(ds.sample_id) == len(df) - 6


@pytest.mark.parametrize("missing", ["error", "drop"])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_all_missing_column_is_named(tmp_path, fmt, missing):
    # `missing: drop` said only "no rows left (of 60) after dropping rows with missing values", naming no column;
    # `missing: error` listed every row and suggested `missing: drop`, which cannot work.
    df = _table()
    df["empty"] = np.nan
    path = tmp_path / f"t.{fmt}"
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path, index=False)
    with pytest.raises(DataError) as e:
        load_table(path=path, id_column="id", label_column="label", missing=missing)
    msg = str(e.value)
    assert "'empty'" in msg and "no value in any" in msg and "feature_columns" in msg
    assert "no rows left" not in msg


def test_all_missing_column_left_out_via_feature_columns_loads(tmp_path):
    df = _table()
    df["empty"] = np.nan
    df.to_csv(tmp_path / "t.csv", index=False)
    ds = load_table(path=tmp_path / "t.csv", id_column="id", label_column="label", feature_columns=["x"])
    assert ds.X.shape == (len(df), 1)


def _write(df: pd.DataFrame, path) -> None:
    df.to_csv(path, index=False) if str(path).endswith(".csv") else df.to_parquet(path, index=False)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("dates", [
    lambda n: [f"2024-01-{1 + i % 3:02d}" for i in range(n)],          # few distinct: was one-hot encoded (CSV)
    lambda n: [f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(n)],  # many: was "identifies rows"
    lambda n: [f"2024-01-05T{i % 24:02d}:30:00Z" for i in range(n)],
    lambda n: [f"{1 + i % 12}/{1 + i % 28}/2023" for i in range(n)],
    lambda n: [f"{8 + i % 3:02d}:30" for i in range(n)],
], ids=["iso-few", "iso-many", "iso-time-zone", "us-slashes", "time-of-day"])
def test_date_text_is_refused_as_dates_in_csv_and_parquet(tmp_path, fmt, dates):
    # A CSV date column is text to pandas: it was one-hot encoded silently (few distinct dates) or refused with
    # "identify rows" (many), while the same dates from Parquet were refused as dates. Now both say dates.
    df = _table()
    df["seen"] = dates(len(df))
    _write(df, tmp_path / f"t.{fmt}")
    with pytest.raises(DataError, match=r"'seen' holds dates/times .*days since a reference date"):
        load_table(path=tmp_path / f"t.{fmt}", id_column="id", label_column="label")


@pytest.mark.parametrize("values", [
    lambda n: [datetime.date(2024, 1, 1 + i % 3) for i in range(n)],  # Parquet DATE (a database's DATE column)
    lambda n: [datetime.time(8 + i % 3, 30) for i in range(n)],      # Parquet TIME
], ids=["date32", "time64"])
def test_parquet_date_and_time_objects_are_refused_as_dates(tmp_path, values):
    df = _table()
    df["seen"] = values(len(df))
    df.to_parquet(tmp_path / "t.parquet", index=False)
    with pytest.raises(DataError, match=r"'seen' holds dates/times \((date|time) values\)"):
        load_table(path=tmp_path / "t.parquet", id_column="id", label_column="label")


@pytest.mark.parametrize("values", [
    lambda n: [f"v{i % 3}" for i in range(n)],
    lambda n: [f"2024-Q{1 + i % 4}" for i in range(n)],   # the fix the message suggests
    lambda n: ["12:30" if i else "lunch" for i in range(n)],  # not every value is a time
    lambda n: [f"{i % 4}-{i % 3}" for i in range(n)],          # two numbers with a dash: a code, not a date
], ids=["plain", "quarters", "mixed", "code"])
def test_categories_that_are_not_dates_still_load(tmp_path, values):
    df = _table()
    df["kind"] = values(len(df))
    _write(df, tmp_path / "t.csv")
    ds = load_table(path=tmp_path / "t.csv", id_column="id", label_column="label")
    assert any(name.startswith("kind=") for name in ds.meta["preprocessing"]["feature_names"])


@pytest.mark.parametrize("cell", [lambda i: [i, i + 1], lambda i: {"a": i}, lambda i: b"\x00\x01"],
                         ids=["list", "struct", "binary"])
def test_parquet_nested_and_binary_columns_are_refused(tmp_path, cell):
    # A Parquet list column was one-hot encoded by the text of each list ("[0 1]"), a struct by its repr.
    df = _table()
    df["tags"] = [cell(i % 3) for i in range(len(df))]
    df.to_parquet(tmp_path / "t.parquet", index=False)
    with pytest.raises(DataError, match=r"'tags' holds (ndarray|dict|bytes) values .*flatten it"):
        load_table(path=tmp_path / "t.parquet", id_column="id", label_column="label")


@pytest.mark.parametrize("grayscale", [True, False])
def test_transparent_pixels_read_as_black_whatever_colour_they_store(tmp_path, grayscale):
    # An RGBA image lost its alpha: a transparent pixel read as the colour it happened to store (white here).
    from PIL import Image

    from unlearning.data.sources import read_images

    a = np.zeros((4, 4, 4), dtype=np.uint8)
    a[..., :3] = 255          # every pixel stores white ...
    a[:2, :, 3] = 255         # ... the top half is opaque, the bottom half fully transparent
    Image.fromarray(a, "RGBA").save(tmp_path / "a.png")
    Image.fromarray(a[..., [0, 3]], "LA").save(tmp_path / "b.png")
    X = read_images([tmp_path / "a.png", tmp_path / "b.png"], 4, grayscale=grayscale)
    img = X.reshape(2, 1 if grayscale else 3, 4, 4)
    assert np.allclose(img[:, :, :2], 1.0) and np.allclose(img[:, :, 2:], 0.0)


@pytest.mark.parametrize("grayscale", [True, False])
def test_16_bit_grey_png_is_scaled_not_clipped(tmp_path, grayscale):
    # A 16-bit PNG (mode I;16) read as almost all white: Pillow's convert("L") clips every value above 255.
    from PIL import Image

    from unlearning.data.sources import read_images

    a = (np.arange(16, dtype=np.float64).reshape(4, 4) / 15 * 65535).round().astype(np.uint16)
    Image.fromarray(a).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode in ("I;16", "I")
    Image.fromarray((a // 257).astype(np.uint8)).save(tmp_path / "flat.png")  # the same picture in 8 bits
    X = read_images([tmp_path / "deep.png", tmp_path / "flat.png"], 4, grayscale=grayscale)
    assert np.allclose(X[0], np.tile((a / 65535.0).reshape(-1), 1 if grayscale else 3), atol=1e-6)
    assert np.allclose(X[0], X[1], atol=1 / 255)


def test_float_image_outside_unit_range_is_refused_by_name(tmp_path):
    from PIL import Image

    from unlearning.data.sources import read_images

    Image.fromarray(np.full((4, 4), 3.5, dtype=np.float32), mode="F").save(tmp_path / "hdr.tiff")
    Image.fromarray(np.full((4, 4), 0.25, dtype=np.float32), mode="F").save(tmp_path / "ok.tiff")
    assert np.allclose(read_images([tmp_path / "ok.tiff"], 4), 0.25)
    with pytest.raises(DataError, match=r"hdr\.tiff .*\[3\.5, 3\.5\], outside \[0, 1\]"):
        read_images([tmp_path / "hdr.tiff"], 4)


def test_an_exif_rotated_photo_reads_as_a_viewer_shows_it(tmp_path):
    # A phone photo stores its pixels sideways with an EXIF orientation tag: read as stored, a class whose
    # photos came from two phones held differently was two different pictures.
    from PIL import Image

    from unlearning.data.sources import read_images

    stored = np.zeros((6, 6), dtype=np.uint8)
    stored[:, 0] = 255                        # stored: the left column white
    im = Image.fromarray(stored)
    exif = im.getexif()
    exif[0x0112] = 6                          # "rotate 90 degrees clockwise to display"
    im.save(tmp_path / "phone.jpg", exif=exif.tobytes(), quality=100)
    shown = np.rot90(stored, -1)              # displayed: the top row white
    Image.fromarray(np.ascontiguousarray(shown)).save(tmp_path / "plain.png")
    X = read_images([tmp_path / "phone.jpg", tmp_path / "plain.png"], 6)
    assert np.abs(X[0] - X[1]).max() < 0.1 and X[0].reshape(6, 6)[0].mean() > 0.9


def test_a_16_bit_grey_png_with_a_transparent_key_is_scaled_not_clipped(tmp_path):
    # tRNS transparency sent it through convert("RGBA"), which clipped it to all white
    from PIL import Image

    from unlearning.data.sources import read_images

    a = np.full((4, 4), 32768, dtype=np.uint16)
    a[0, 0] = 0
    Image.fromarray(a).save(tmp_path / "keyed.png", transparency=0)
    X = read_images([tmp_path / "keyed.png"], 4)
    assert np.allclose(X[0][1:], 32768 / 65535, atol=1e-6) and X[0][0] == 0


def _image_folder(root, names):
    from PIL import Image

    for name in names:
        f = root / name
        f.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4), 128, dtype=np.uint8)).save(f)


@pytest.mark.parametrize("bad, why", [("cats/trail .png", "spaces around"), (" dogs/lead.png", "spaces around"),
                                      ("cats/tab\there.png", "control character"),
                                      ("cats/line\nbreak.png", "control character")])
def test_image_files_whose_ids_no_request_could_name_are_refused_by_file(tmp_path, bad, why):
    # The id of an image is its path without the suffix: 'cats/trail ' was trained on, but request files
    # refuse ids with spaces around them or control characters, so that image could never be erased.
    from unlearning.data.sources import load_image_folder

    names = [f"cats/c{i}.png" for i in range(6)] + [f"dogs/d{i}.png" for i in range(6)]
    _image_folder(tmp_path, names + [bad])
    with pytest.raises(DataError, match=why) as e:
        load_image_folder(tmp_path, image_size=4)
    assert repr(bad)[1:-1] in str(e.value) and "rename" in str(e.value)
    (tmp_path / bad).unlink()
    if not any((tmp_path / bad).parent.iterdir()):
        (tmp_path / bad).parent.rmdir()  # an empty class folder is refused too
    assert len(load_image_folder(tmp_path, image_size=4).sample_id) == len(names)


def test_inner_spaces_in_image_names_are_kept(tmp_path):
    # A space inside a name ('cats/my cat', or 'cats/ lead' whose id has no space AROUND it) is a nameable id
    from unlearning.data.sources import load_image_folder

    _image_folder(tmp_path, [f"cats/my cat {i}.png" for i in range(5)] + [f"dogs/ d{i}.png" for i in range(5)])
    ids = set(load_image_folder(tmp_path, image_size=4).sample_id)
    assert "cats/my cat 0" in ids and "dogs/ d0" in ids


def test_an_empty_class_folder_is_named_not_dropped(tmp_path):
    from unlearning.data.sources import load_image_folder

    _image_folder(tmp_path, [f"cats/c{i}.png" for i in range(4)] + [f"dogs/d{i}.png" for i in range(4)])
    (tmp_path / "birds").mkdir()
    (tmp_path / "birds" / ".DS_Store").write_bytes(b"")  # hidden files do not count as images
    with pytest.raises(DataError, match=r"class folders 'birds/' hold no image"):
        load_image_folder(tmp_path, image_size=4)


def test_a_class_with_val_images_only_is_refused(tmp_path):
    from unlearning.data.sources import load_image_folder

    _image_folder(tmp_path, [f"train/cats/c{i}.png" for i in range(4)] + [f"train/dogs/d{i}.png" for i in range(4)]
                  + ["val/cats/v.png", "val/birds/b.png"])
    with pytest.raises(DataError, match=r"classes 'birds' have images in val/ but none in train/"):
        load_image_folder(tmp_path, image_size=4)
    (tmp_path / "val" / "birds" / "b.png").unlink()
    (tmp_path / "val" / "birds").rmdir()
    assert set(load_image_folder(tmp_path, image_size=4).fine_class_names) == {"cats", "dogs"}


@pytest.mark.parametrize("stray", ["-", "unknown", "1,5"])
def test_a_column_of_numbers_with_a_stray_text_cell_is_refused_by_cell(tmp_path, stray):
    # UCI files mark an unknown age with '?': the column was read as text and one-hot encoded silently (73
    # features, each age a category of its own)
    df = _table(200)
    df["age"] = (np.arange(200) % 60 + 18).astype(object)
    df.loc[7, "age"] = stray
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=rf"feature column 'age' holds numbers \(60 distinct\) except for 1 "
                                        rf"cell\(s\): '{re.escape(stray)}' in rows 'r7'.*Make those cells empty"):
        load_table(path=tmp_path / "t.csv", id_column="id", label_column="label")
    df.loc[7, "age"] = None  # the fix the message gives: an empty cell, dropped with missing: drop
    df.to_csv(tmp_path / "t.csv", index=False)
    ds = load_table(path=tmp_path / "t.csv", id_column="id", label_column="label", missing="drop")
    assert ds.meta["preprocessing"]["feature_names"] == ["x", "age"] and len(ds.label) == 199


def test_a_missing_marker_in_a_column_of_numbers_is_a_missing_value(tmp_path):
    # UCI files mark an unknown age with '?' (prepare.table.missing_markers): a gap in a number column, refused
    # as missing by default and dropped with missing: drop, never a category
    df = _table(200)
    df["age"] = (np.arange(200) % 60 + 18).astype(object)
    df.loc[7, "age"] = "?"
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=r"rows with missing values: 1 \(cells per column: 'age' 1\), e\.g\. 'r7'"):
        load_table(path=tmp_path / "t.csv", id_column="id", label_column="label")
    ds = load_table(path=tmp_path / "t.csv", id_column="id", label_column="label", missing="drop")
    assert ds.meta["preprocessing"]["feature_names"] == ["x", "age"] and len(ds.label) == 199


def test_a_stray_text_cell_is_named_also_where_the_numbers_are_too_many_categories(tmp_path):
    # 300 distinct prices and one '-': the count-of-categories refusal came first and named no cell
    df = _table(300)
    df["price"] = (np.arange(300) * 1.5).astype(object)
    df.loc[42, "price"] = "-"
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=r"feature column 'price' holds numbers \(299 distinct\) except for 1 "
                                        r"cell\(s\): '-' in rows 'r42'"):
        load_table(path=tmp_path / "t.csv", id_column="id", label_column="label")


def test_category_codes_with_a_letter_stay_categories(tmp_path):
    # a few codes (1, 2, 3, 'A') and a text column with numbers among its words are categories as before
    df = _table(60)
    df["grade"] = [["1", "2", "3", "A"][i % 4] for i in range(60)]
    df["size"] = [["S", "M", "L", "10", "12"][i % 5] for i in range(60)]
    df.to_csv(tmp_path / "t.csv", index=False)
    ds = load_table(path=tmp_path / "t.csv", id_column="id", label_column="label")
    names = ds.meta["preprocessing"]["feature_names"]
    assert "grade=A" in names and "size=10" in names
