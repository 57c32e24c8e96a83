"""TinyImageNet (FedSpeed's third dataset, Sun et al. 2023) from its release.

`tiny-imagenet-200.zip` (CS231n, Stanford) unpacks to:

    tiny-imagenet-200/wnids.txt              one WordNet id per line (200)
    tiny-imagenet-200/train/<wnid>/images/*.JPEG   500 per class
    tiny-imagenet-200/val/images/*.JPEG            10,000
    tiny-imagenet-200/val/val_annotations.txt      file<TAB>wnid<TAB>box...

The labelled validation set serves as the test split (the release's `test/`
has no labels). Class c is the c-th line of `wnids.txt`; training images are
read class by class, files sorted by name, and validation images in the order
of `val_annotations.txt`. Every image must be 64 x 64; grayscale (and any
other mode) is converted to RGB. Pixels come back as uint8 [N, 64, 64, 3];
`load_dataset` scales them to float32 in [0, 1] (4.9 GB for the 100,000
training images).

JPEG files are untrusted: the size is checked from the header before any
pixel is decoded, and a truncated or undecodable file raises DataError.
"""

import os

import numpy as np

from fedjax_lama.data.data_errors import DataError

IMAGE_SIZE = 64
WNIDS_FILE = 'wnids.txt'
VAL_ANNOTATIONS = os.path.join('val', 'val_annotations.txt')
_EXTENSIONS = ('.jpeg', '.jpg')
_MAX_TEXT_BYTES = 1 << 24


def _import_pil():
  try:
    from PIL import Image  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # pragma: no cover
    raise DataError('reading TinyImageNet needs Pillow: pip install Pillow'
                    ) from e
  return Image


def _read_text(path: str) -> list[str]:
  if not os.path.isfile(path):
    raise DataError(f'{path}: file not found')
  if os.path.getsize(path) > _MAX_TEXT_BYTES:
    raise DataError(f'{path}: larger than {_MAX_TEXT_BYTES} bytes')
  with open(path, 'rb') as f:
    raw = f.read()
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    raise DataError(f'{path}: not UTF-8 text ({e})') from e
  return [line.strip() for line in text.splitlines() if line.strip()]


def read_wnids(path: str) -> list[str]:
  """The class ids, one per line, in file order (class c = line c)."""
  wnids = _read_text(path)
  if not wnids:
    raise DataError(f'{path}: no class ids')
  for w in wnids:
    if any(ch in w for ch in '/\\\t ') or w in ('.', '..'):
      raise DataError(f'{path}: {w!r} is not a valid class id')
  if len(set(wnids)) != len(wnids):
    raise DataError(f'{path}: duplicate class ids')
  return wnids


def read_image(path: str, image_module=None) -> np.ndarray:
  """One 64 x 64 image as uint8 [64, 64, 3] (converted to RGB)."""
  image_module = image_module or _import_pil()
  try:
    with image_module.open(path) as im:
      if im.size != (IMAGE_SIZE, IMAGE_SIZE):
        raise DataError(
            f'{path}: image is {im.size[0]}x{im.size[1]}, expected '
            f'{IMAGE_SIZE}x{IMAGE_SIZE}')
      rgb = im.convert('RGB')
      arr = np.asarray(rgb, np.uint8)
  except DataError:
    raise
  except (OSError, ValueError, SyntaxError, EOFError,
          image_module.DecompressionBombError) as e:
    # UnidentifiedImageError is an OSError.
    raise DataError(f'{path}: not a readable image ({e})') from e
  if arr.shape != (IMAGE_SIZE, IMAGE_SIZE, 3):
    raise DataError(f'{path}: decoded to shape {arr.shape}')
  return arr


def _images_in(directory: str) -> list[str]:
  if not os.path.isdir(directory):
    raise DataError(f'{directory}: directory not found')
  names = sorted(n for n in os.listdir(directory)
                 if n.lower().endswith(_EXTENSIONS))
  return [os.path.join(directory, n) for n in names]


def _stack(paths: list[str], image_module) -> np.ndarray:
  out = np.empty((len(paths), IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
  for i, p in enumerate(paths):
    out[i] = read_image(p, image_module)
  return out


def read_val_annotations(path: str, classes: dict[str, int]
                         ) -> list[tuple[str, int]]:
  """(file name, class) per line of `val_annotations.txt`, in file order."""
  out, seen = [], set()
  for k, line in enumerate(_read_text(path), 1):
    parts = line.split('\t')
    if len(parts) < 2:
      raise DataError(
          f'{path}: line {k}: expected "file<TAB>wnid<TAB>..." got {line!r}')
    name, wnid = parts[0], parts[1]
    if os.path.basename(name) != name or name in ('.', '..') or not name:
      raise DataError(f'{path}: line {k}: {name!r} is not a plain file name')
    if wnid not in classes:
      raise DataError(f'{path}: line {k}: class {wnid!r} is not in wnids.txt')
    if name in seen:
      raise DataError(f'{path}: line {k}: {name!r} is listed twice')
    seen.add(name)
    out.append((name, classes[wnid]))
  if not out:
    raise DataError(f'{path}: no annotations')
  return out


def read_tinyimagenet(root: str) -> tuple[np.ndarray, ...]:
  """Reads `root` (the `tiny-imagenet-200` directory).

  Returns:
    (train_x, train_y, test_x, test_y, num_classes): uint8 NHWC images of
    64 x 64 x 3, int32 labels in [0, num_classes); test is the labelled
    validation set.

  Raises:
    DataError: a missing file or directory, a class without training images,
      a malformed annotation line, or an image that is not a decodable
      64 x 64 picture.
  """
  image_module = _import_pil()
  wnids = read_wnids(os.path.join(root, WNIDS_FILE))
  classes = {w: c for c, w in enumerate(wnids)}
  paths, labels = [], []
  for c, w in enumerate(wnids):
    directory = os.path.join(root, 'train', w, 'images')
    found = _images_in(directory)
    if not found:
      raise DataError(f'{directory}: no JPEG images for class {w}')
    paths.extend(found)
    labels.extend([c] * len(found))
  train_x = _stack(paths, image_module)
  train_y = np.asarray(labels, np.int32)
  annotations = read_val_annotations(os.path.join(root, VAL_ANNOTATIONS),
                                     classes)
  val_dir = os.path.join(root, 'val', 'images')
  val_paths = [os.path.join(val_dir, n) for n, _ in annotations]
  for p in val_paths:
    if not os.path.isfile(p):
      raise DataError(
          f'{p}: listed in {os.path.join(root, VAL_ANNOTATIONS)} but not found')
  test_x = _stack(val_paths, image_module)
  test_y = np.asarray([c for _, c in annotations], np.int32)
  return train_x, train_y, test_x, test_y, len(wnids)
