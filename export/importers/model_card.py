"""The model card stub of an imported model: where it came from, so a served model can be traced back."""

from __future__ import annotations

import hashlib
import json
import pathlib

from attnserve.export.importers.checkpoint import Checkpoint


def write(model_dir: pathlib.Path, ckpt: Checkpoint, manifest: dict, variant: str) -> pathlib.Path:
    """Writes (or rewrites) model_dir/README.md for the version just imported."""
    import torch
    import transformers

    config_bytes = json.dumps(ckpt.config, sort_keys=True).encode()
    lines = [
        f"# {manifest['name']}",
        "",
        f"Imported by `attnserve import` from a transformers checkpoint ({ckpt.architecture}); its quality is",
        "the checkpoint's own, not measured here. See docs/import.md.",
        "",
        f"- version: {manifest['version']}",
        f"- languages: {', '.join(manifest['languages']['source'])} -> {', '.join(manifest['languages']['target'])}",
        f"- source folder: `{ckpt.folder.name}`",
        f"- config.json (canonical JSON) SHA-256: `{hashlib.sha256(config_bytes).hexdigest()}`",
        f"- converted with transformers {transformers.__version__}, torch {torch.__version__}",
        f"- variant written besides float32: {variant if variant != 'fp32' else 'none'}",
        "",
        "| checkpoint file | SHA-256 |",
        "|---|---|",
        *[f"| `{name}` | `{digest}` |" for name, digest in ckpt.provenance().items()],
        "",
    ]
    path = model_dir / "README.md"
    path.write_text("\n".join(lines))
    return path
