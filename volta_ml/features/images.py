"""Image decoding and the two detectors' exact input pipelines.

Decoding follows VOLTA: OpenCV, 3-channel BGR uint8, EXIF orientation applied
(OpenCV's `imdecode` does this, like `imread`). Before decoding, the header is read
(lazily, with Pillow) so a decompression bomb is rejected without allocating it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

# The BGR pixel means both detectors subtract.
PIXEL_MEAN_BGR = (102.9801, 115.9465, 122.7717)
DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own bomb threshold (~ 0.25 GiB of RGB)


class ImageError(Exception):
    """An image that cannot be used; the message says why (goes to the failure manifest)."""


def _cv2():
    try:
        import cv2
    except ImportError as err:  # pragma: no cover - dependency message
        raise ImportError("feature extraction needs OpenCV: pip install opencv-python-headless") from err
    return cv2


def read_image_bgr(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS, min_side: int = 1) -> np.ndarray:
    """Decode `path` to an H x W x 3 uint8 BGR array (EXIF orientation applied)."""
    from PIL import Image

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ImageError(f"{path}: cannot read file ({err})") from err
    if not data:
        raise ImageError(f"{path}: empty file")
    return decode_image_bytes(data, name=str(path), max_pixels=max_pixels, min_side=min_side, _pil=Image)


def decode_image_bytes(data: bytes, name: str = "<bytes>", max_pixels: int = DEFAULT_MAX_PIXELS,
                       min_side: int = 1, _pil=None) -> np.ndarray:
    import io
    import warnings

    if _pil is None:
        from PIL import Image as _pil
    # Header only: Pillow reads the size without decoding pixel data.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            saved = _pil.MAX_IMAGE_PIXELS
            _pil.MAX_IMAGE_PIXELS = None  # we apply our own limit below, with a clear message
            try:
                with _pil.open(io.BytesIO(data)) as im:
                    w, h = im.size
            finally:
                _pil.MAX_IMAGE_PIXELS = saved
    except Exception as err:
        raise ImageError(f"{name}: not a readable image ({type(err).__name__}: {err})") from err
    if w * h > max_pixels:
        raise ImageError(f"{name}: {w}x{h} = {w * h} pixels exceeds the limit of {max_pixels} "
                         "(possible decompression bomb; raise --max-pixels if the image is genuine)")
    cv2 = _cv2()
    img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ImageError(f"{name}: OpenCV could not decode the image (corrupt or unsupported)")
    if min(img.shape[:2]) < min_side:
        raise ImageError(f"{name}: degenerate image of {img.shape[1]}x{img.shape[0]} pixels")
    return img


# ----------------------------------------------------------------------------- BUTD (detectron2)
def shortest_edge_size(h: int, w: int, short: int, long: int) -> tuple[int, int]:
    """detectron2 ResizeShortestEdge: (new_h, new_w), long side capped, int(x + 0.5) rounding."""
    scale = short * 1.0 / min(h, w)
    if h < w:
        new_h, new_w = short, scale * w
    else:
        new_h, new_w = scale * h, short
    if max(new_h, new_w) > long:
        scale = long * 1.0 / max(new_h, new_w)
        new_h, new_w = new_h * scale, new_w * scale
    return int(new_h + 0.5), int(new_w + 0.5)


def butd_resize(img_bgr: np.ndarray, short: int, long: int) -> np.ndarray:
    """Pillow bilinear (antialiased) resize of the uint8 BGR array, as detectron2 does."""
    from PIL import Image

    new_h, new_w = shortest_edge_size(img_bgr.shape[0], img_bgr.shape[1], short, long)
    resized = Image.fromarray(np.ascontiguousarray(img_bgr)).resize((new_w, new_h), Image.BILINEAR)
    return np.asarray(resized)


def butd_input(resized_bgr: np.ndarray) -> torch.Tensor:
    """(1, 3, h, w) float32 network input: BGR minus the pixel means."""
    x = torch.as_tensor(resized_bgr.astype("float32").transpose(2, 0, 1))
    mean = torch.tensor(PIXEL_MEAN_BGR, dtype=torch.float32).view(3, 1, 1)
    return (x - mean).unsqueeze(0)


# ----------------------------------------------------------------------------- X101 (MMF / VOLTA)
def x101_input(img_bgr: np.ndarray, min_size: int, max_size: int) -> tuple[np.ndarray, float]:
    """VOLTA's MMF pipeline: float32, channels flipped to RGB (quirk), BGR means subtracted,
    cv2 INTER_LINEAR resize by one factor. Returns (H x W x 3 float32, scale)."""
    cv2 = _cv2()
    im = img_bgr.astype(np.float32)[:, :, ::-1]
    im = im - np.array(PIXEL_MEAN_BGR)  # float64 subtraction ...
    im = im.astype(np.float32)  # ... rounded once, like numpy's in-place op on a float32 array
    size_min, size_max = min(im.shape[:2]), max(im.shape[:2])
    scale = float(min_size) / float(size_min)
    if np.round(scale * size_max) > max_size:
        scale = float(max_size) / float(size_max)
    im = cv2.resize(im, None, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
    return im, scale


def pad_batch(images_hwc: list[np.ndarray], divisor: int = 32) -> torch.Tensor:
    """Zero-pad images (bottom/right) to a common size that is a multiple of `divisor`."""
    h = max(im.shape[0] for im in images_hwc)
    w = max(im.shape[1] for im in images_hwc)
    h = (h + divisor - 1) // divisor * divisor
    w = (w + divisor - 1) // divisor * divisor
    out = torch.zeros(len(images_hwc), 3, h, w, dtype=torch.float32)
    for i, im in enumerate(images_hwc):
        out[i, :, : im.shape[0], : im.shape[1]] = torch.from_numpy(np.ascontiguousarray(im.transpose(2, 0, 1)))
    return out
