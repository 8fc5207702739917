"""attnserve.export: corpora, training, ONNX export, evaluation and model cards, one subpackage per model family.

translation/ (the bundled zh-TW <-> en translators), speech/ (listen, attend and spell), image/ (show, attend
and tell), video/ (the clip captioner, built on image/), importers/ (`attnserve import` for Hugging Face
checkpoints), and common/ beneath them all: what the families share, so that none imports another for it
(docs/architecture.md, "Which way imports point"). Commands: `python -m attnserve.export.<family>.<module>`.
"""
