"""The one way this repository writes files: atomically, so a reader never sees half a file.

Every writer puts its bytes into a temporary sibling (same directory, so the final
``os.replace`` is a rename on one filesystem), flushes and fsyncs it, gives it the ordinary
file mode (``0o666`` minus the umask, as ``open`` would; ``tempfile`` alone leaves ``0o600``),
and only then renames it over the target. A crash, a signal or a full disk leaves the previous
file (or none) and no temporary file behind.

- ``atomic_write(path, write, binary=...)``: the core; ``write(f)`` fills an open file object.
- ``atomic_write_text`` / ``atomic_write_bytes`` / ``atomic_write_json``: the common cases;
  JSON is strict (non-finite floats become ``null``, so every reader can parse it).
- ``atomic_savefig(fig, path)``: a matplotlib figure as PNG (or the suffix's format).
- ``atomic_directory(final)``: build a whole directory (a prepared dataset, a cache entry) in a
  temporary sibling and rename it into place at the end; losing a race to a concurrent writer
  that finished first is not an error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _file_mode() -> int:
    return 0o666 & ~_umask()


def atomic_write(path: str | os.PathLike, write: Callable[[IO], Any], *, binary: bool = False) -> Path:
    """Call ``write(f)`` on a temporary sibling of ``path`` opened for writing, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(text))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(data), binary=True)


def to_strict_json(value: Any) -> Any:
    """``value`` with what strict JSON cannot hold made plain: NaN and infinities become None,
    numpy/torch scalars and arrays their Python values, paths strings, tuples and sets lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k) if isinstance(k, Path) else k: to_strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_strict_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars, tensors
        return to_strict_json(value.tolist())
    if hasattr(value, "item") and callable(value.item):
        return to_strict_json(value.item())
    return value


def json_text(data: Any, *, indent: int | None = 2) -> str:
    """``data`` as strict JSON text (see ``to_strict_json``), ending in a newline."""
    return json.dumps(to_strict_json(data), indent=indent, allow_nan=False) + "\n"


def atomic_write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as strict JSON to ``path`` atomically."""
    return atomic_write_text(path, json_text(data, indent=indent))


def atomic_savefig(fig, path: str | os.PathLike, *, dpi: int = 120, **kwargs) -> Path:
    """Save a matplotlib figure to ``path`` atomically, in the format of the path's suffix (PNG by default)."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    kwargs.setdefault("bbox_inches", "tight")
    return atomic_write(path, lambda f: fig.savefig(f, format=fmt, dpi=dpi, **kwargs), binary=True)


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, *, complete: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``final`` to fill; rename it to ``final`` when the block ends.

    On an exception (or a signal turned into one) the temporary directory is removed and
    ``final`` is untouched. If ``final`` appeared meanwhile (a concurrent writer finished first)
    and ``complete(final)`` says it is whole (default: it is a directory), ours is dropped.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0o700
        try:
            os.rename(tmp, final)
        except OSError:
            done = complete(final) if complete is not None else final.is_dir()
            if not done:  # not a concurrent writer that won the race: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
