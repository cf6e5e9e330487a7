"""The checkpoints the contract bench loads: a given folder, a family's small random one, or either quantized.

Small checkpoints come from the registry (``make_small_checkpoint`` of the family's adapter, through
``phyai_ros.fixtures``, which finds the shared fixtures some families copy files from), so a family outside the
package is benched the same way. Quantizing goes through ``python -m phyai_ros.quant``'s own entry (the family's
``quantize`` hook), so a benched quantized folder is the one a robot would load. The full-size random checkpoints
are the family scripts' to write (phyai_ros/bench/full_size.py): drawing billions of weights needs the device.
"""
from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path
from typing import Optional, Sequence

from phyai_ros.fixtures import make_small_checkpoint, tokenizer_path
from phyai_ros.models.contract import ModelFiles


def small(model: str, root: Path, cameras: Optional[Sequence[str]] = None) -> Path:
    """A fresh small random checkpoint of ``model`` under ``root`` (with ``cameras`` where a view count asks for
    other cameras than the family's default: a family that takes every camera of its checkpoint needs a
    checkpoint per count). ValueError where the family's maker cannot (its fixtures missing, fixed cameras)."""
    folder = Path(root) / (f"{model}-small" + (f"-{len(cameras)}views" if cameras else ""))
    shutil.rmtree(folder, ignore_errors=True)
    try:
        return make_small_checkpoint(folder, policy=model, **({"cameras": tuple(cameras)} if cameras else {}))
    except TypeError as exc:   # the maker takes no cameras
        raise ValueError(f"{model}'s small checkpoint has fixed cameras ({exc}); bench other view counts with "
                         "--checkpoint DIR") from None
    except FileNotFoundError as exc:
        raise ValueError(f"{model}: no small checkpoint: {exc}") from None


def model_files(needs: Sequence[str], tokenizer: Optional[Path]) -> ModelFiles:
    """The files a family reads besides its folder: the tokenizer (given, else the shared fixtures') where it
    needs one; its statistics always from the checkpoint folder."""
    if "tokenizer" not in needs:
        if tokenizer is not None:
            raise ValueError("--tokenizer: this family reads its tokenizer from the checkpoint folder")
        return ModelFiles()
    tok = tokenizer or tokenizer_path()
    if tok is None or not Path(tok).is_file():
        raise ValueError(f"this family needs a tokenizer file: none at {tok or 'the shared fixtures'} (give "
                         "--tokenizer FILE or set PHYAI_PARITY_FIXTURES)")
    return ModelFiles.of(tokenizer=tok)


def quantized(checkpoint: Path, scheme: str, out: Path, device: str, dtype: str, files: ModelFiles) -> Path:
    """``checkpoint`` quantized with ``scheme`` (the quantizer's default parts and dynamic activation scales) into
    the fresh folder ``out``; ValueError with the quantizer's message where it refuses."""
    from phyai_ros.quant.__main__ import main as quant_main   # the tool's entry: its checks and its defaults
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    argv = ["--checkpoint", str(checkpoint), "--output", str(out), "--scheme", scheme, "--device", device,
            "--dtype", dtype]
    if files.tokenizer is not None:
        argv += ["--tokenizer", str(files.tokenizer)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = quant_main(argv)
    if rc != 0:
        raise ValueError(f"--quant {scheme}: {err.getvalue().strip().removeprefix('error: ')}")
    return out


__all__ = ["small", "model_files", "quantized"]
