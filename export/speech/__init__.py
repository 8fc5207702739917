"""Synthesized English speech corpus for the speech captioner (Listen, Attend and Spell).

Sentences from the translation corpus are read aloud by several text-to-speech engines
(espeak-ng, flite, festival for training; Piper, festival ``slt`` and flite ``slt`` held
out as unseen voices), perturbed with sox, and written as 16 kHz WAV files with one
JSONL manifest per split that records the engine, voice, augmentation and the engine's
own word times. Entry point: ``python -m attnserve.export.speech.build``; see
docs/speech-corpus.md.
"""
