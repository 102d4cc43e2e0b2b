"""Write a slim copy of a training checkpoint: the weights and what rebuilds the model, without
the optimiser, loop and callback states (about a third of the size). It serves ``repro test``,
``repro validate``, ``repro predict`` and ``repro analyze``; it cannot resume training.

    python scripts/slim_checkpoint.py runs/<experiment>/<variant>/seed0/checkpoints/last.ckpt demo.ckpt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_modules.checkpoint_io import CheckpointError, slim_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="a checkpoint written by a run")
    parser.add_argument("dst", help="where to write the slim checkpoint")
    args = parser.parse_args(argv)
    try:
        slim = slim_checkpoint(args.src, args.dst)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = Path(args.dst).stat().st_size
    print(f"{args.dst}: {size / 1e6:.2f} MB, epoch {slim.get('epoch')}, step {slim.get('global_step')}, "
          f"{len(slim['state_dict'])} tensors (from {Path(args.src).stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
