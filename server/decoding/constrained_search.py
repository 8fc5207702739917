"""Constrained beam search with dynamic beam allocation (Post & Vilar 2018): glossary terms in the output.

Each request carries constraints (server/decoding/glossary.py): token sequences its output must contain. Every beam
tracks which constraints it has met and how far into one it is. At each step a request's candidates are
the usual best extensions (the 2k best over its beams), each beam's single best token, and for each beam
the next token of every constraint it could advance (the next token of the one it is inside, else the
first token of each one not yet met). Candidates are grouped into banks by how many constraint tokens they
have met, and the k beams are shared out among the banks, fullest bank first, the rest going to the best
candidates left: so hypotheses that placed a term survive next to the model's favourites without
crowding them out. A beam may end (EOS) only once every constraint is met.

A request without constraints decodes as in BeamSearch: one bank, the k best non-EOS extensions.
"""

from __future__ import annotations

import numpy as np

from attnserve.server.decoding.search import BeamSearch, Selection, StepEvents
from attnserve.server.decoding.log_softmax import log_softmax


class _State:
    """Constraint progress of rows: met (bit mask), the constraint being spelled (-1 none), tokens into it."""

    def __init__(self, met: np.ndarray, current: np.ndarray, pos: np.ndarray):
        self.met, self.current, self.pos = met, current, pos

    def take(self, rows: np.ndarray) -> _State:
        return _State(self.met[rows], self.current[rows], self.pos[rows])


class ConstrainedBeamSearch(BeamSearch):
    """BeamSearch whose requests' outputs must contain their constraints' token sequences."""

    def start(self) -> Selection:
        selection = super().start()
        self._targets = [[c.token_ids for c in r.constraints] for r in self.requests]  # per request
        self._needed = np.array([sum(map(len, t)) for t in self._targets], dtype=np.int64)  # (N,)
        rows = len(selection.rows)
        self._state = _State(np.zeros(rows, np.int64), np.full(rows, -1, np.int64), np.zeros(rows, np.int64))
        return selection

    def advance(self, logits: np.ndarray, attention: np.ndarray) -> tuple[Selection, StepEvents]:
        k, step = self.k, len(self.history)
        requests = np.repeat(self._alive, k)  # (R*k,)
        self.rules.apply(logits, requests, step)
        unmet = self._met_tokens(self._state, requests) < self._needed[requests]
        logits[unmet, self.eos] = -np.inf  # a beam ends only once every term is placed
        lp = log_softmax(logits)  # (R*k, V)
        chosen = [self._choose(i, lp) for i in range(len(self._alive))]
        # The step's record: each request's k continuing candidates, then its EOS ones.
        rows = np.concatenate([np.concatenate([c[0], e[0]]) for c, e in chosen])
        tokens = np.concatenate([np.concatenate([c[1], e[1]]) for c, e in chosen])
        scores = np.concatenate([np.concatenate([c[2], e[2]]) for c, e in chosen])
        self.history.append(self._parents[rows], tokens, lp[rows, tokens], attention, rows)
        offsets = np.cumsum([0] + [len(c[0]) + len(e[0]) for c, e in chosen])
        entries = np.stack([offsets[i] + np.arange(k) for i in range(len(chosen))])  # (R, k)
        for i, (_, eos) in enumerate(chosen):
            self._keep_finished(int(self._alive[i]), eos[2], offsets[i] + k + np.arange(len(eos[0])), step)
        running = scores[entries]  # (R, k), best first
        state = self._next_state(rows, tokens, self._alive[rows // k])
        complete = (self._met_tokens(state, self._alive[rows // k]) == self._needed[self._alive[rows // k]])[entries]
        done = self._done_complete(running, complete, step)
        cancelled = self._cancelled[self._alive]
        finished = [self._best_complete(i, entries[i], running[i], complete[i], step)
                    for i in np.flatnonzero(done & ~cancelled)]
        keep = ~(done | cancelled)
        kept = entries[keep].ravel()
        self._alive, self._scores, self._parents = self._alive[keep], running[keep], kept
        self._state = state.take(kept)
        none = np.zeros(0, dtype=np.int64)
        self.rules.extend(rows[kept], tokens[kept])
        return Selection(rows[kept], tokens[kept]), StepEvents(none, none, np.zeros(0, np.float32), finished)

    def _choose(self, i: int, lp: np.ndarray):
        """((rows, tokens, scores) of alive request i's k continuing candidates, best first, and of its EOS
        candidates that rank among its k best)."""
        k, index = self.k, int(self._alive[i])
        beams = i * k + np.arange(k)
        total = self._scores[i][:, None] + lp[beams]  # (k, V) summed log-probabilities
        cand = set(zip(*np.unravel_index(np.argsort(-total, axis=None, kind="stable")[: 2 * k], total.shape)))
        cand |= {(b, int(total[b].argmax())) for b in range(k)}
        for b in range(k):
            cand |= {(b, t) for t in self._allowed(index, beams[b])}
        cand = [(b, t) for b, t in cand if np.isfinite(total[b, t])]
        b_idx = np.array([b for b, _ in cand], dtype=np.int64)
        t_idx = np.array([t for _, t in cand], dtype=np.int64)
        score = total[b_idx, t_idx]
        order = np.lexsort((t_idx, b_idx, -score))  # best first, ties in a fixed order
        b_idx, t_idx, score = b_idx[order], t_idx[order], score[order]
        # EOS is possible only where every term is placed: each such candidate is a finished sequence, since
        # a constrained beam's score is rarely among the unconstrained favourites'.
        eos = is_eos = t_idx == self.eos
        go_on = np.flatnonzero(~is_eos)
        rows = beams[b_idx]
        picked = go_on[self._allocate(index, rows[go_on], t_idx[go_on], score[go_on])]
        kept = (rows[picked], t_idx[picked], score[picked])
        if len(picked) < k:  # too few possible candidates: pad with impossible (-inf) copies
            pad = k - len(picked)
            row, token = (kept[0][-1], kept[1][-1]) if len(picked) else (beams[0], self.eos)
            kept = (np.concatenate([kept[0], np.full(pad, row)]), np.concatenate([kept[1], np.full(pad, token)]),
                    np.concatenate([kept[2], np.full(pad, -np.inf)]))
        return kept, (rows[eos], t_idx[eos], score[eos])

    def _done_complete(self, scores: np.ndarray, complete: np.ndarray, step: int) -> np.ndarray:
        """(R,) requests that stop now: at their length limit, or with k finished sequences that no running
        beam with every term placed can beat (a beam still missing terms cannot finish before it has them)."""
        at_limit = step + 1 >= self._max_new[self._alive]
        full = self._n_finished[self._alive] >= self.k
        best = np.where(complete, scores, -np.inf).max(axis=1) / (step + 1)
        return at_limit | (full & (self._early[self._alive] | (best <= self._worst[self._alive])))

    def _best_complete(self, i: int, entries, scores, complete, step: int):
        """BeamSearch._best, where at the length limit only running beams with every term placed compete
        (all of them when none has)."""
        if complete.any():
            entries, scores = entries[complete], scores[complete]
        return self._best(i, entries, scores, step)

    def _allocate(self, index: int, rows: np.ndarray, tokens: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Positions of the k candidates kept (inputs best first): the beam shared among banks of equal
        constraint progress, fullest first, the remainder to the best left; returned best first."""
        k = self.k
        requests = np.full(len(rows), index)
        met = self._met_tokens(self._next_state(rows, tokens, requests), requests)
        banks = self._needed[index] + 1
        quota = max(1, k // banks)
        picked: list[int] = []
        for bank in range(self._needed[index], -1, -1):
            members = np.flatnonzero(met == bank)[:quota]
            picked += members[: k - len(picked)].tolist()
            if len(picked) == k:
                break
        rest = [j for j in range(len(rows)) if j not in set(picked)]
        picked += rest[: k - len(picked)]
        return np.array(sorted(picked, key=lambda j: -scores[j]), dtype=np.int64)

    def _allowed(self, index: int, row: int) -> list[int]:
        """Tokens that advance a constraint from this row: the next of the one it is in, else each unmet first."""
        targets, s = self._targets[index], self._state
        if s.current[row] >= 0:
            return [targets[s.current[row]][s.pos[row]]]
        return [t[0] for c, t in enumerate(targets) if not s.met[row] >> c & 1]

    def _next_state(self, rows, tokens, requests) -> _State:
        """The state after each row of `rows` (into the current state) takes its token; `requests` (the
        request of each) picks the constraints."""
        met, current, pos = self._state.met[rows].copy(), self._state.current[rows].copy(), self._state.pos[rows].copy()
        for j, (token, index) in enumerate(zip(np.asarray(tokens).tolist(), np.asarray(requests).tolist())):
            targets = self._targets[index]
            if current[j] >= 0 and targets[current[j]][pos[j]] == token:
                pos[j] += 1
                if pos[j] == len(targets[current[j]]):
                    met[j] |= 1 << current[j]
                    current[j], pos[j] = -1, 0
                continue
            current[j], pos[j] = -1, 0  # a constraint left half-written starts over
            for c, target in enumerate(targets):
                if not met[j] >> c & 1 and target[0] == token:
                    if len(target) == 1:
                        met[j] |= 1 << c
                    else:
                        current[j], pos[j] = c, 1
                    break
        return _State(met, current, pos)

    def _met_tokens(self, state: _State, requests: np.ndarray) -> np.ndarray:
        """Constraint tokens each row has produced: those of the constraints met, and the one in progress."""
        out = state.pos.copy()
        for j, index in enumerate(np.asarray(requests).tolist()):
            out[j] += sum(len(t) for c, t in enumerate(self._targets[index]) if state.met[j] >> c & 1)
        return out

    def _keep_finished(self, index: int, scores: np.ndarray, entries: np.ndarray, step: int) -> None:
        """Adds EOS candidates as finished sequences of request `index` (its best k kept)."""
        found = self._finished[index]
        for score, entry in zip(scores.tolist(), entries.tolist()):
            found.append((score / (step + 1), step, int(entry)))
        found.sort(key=lambda f: -f[0])
        del found[self.k :]
        self._n_finished[index] = len(found)
        if found:
            self._worst[index] = found[-1][0]
