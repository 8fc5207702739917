"""Shutdown: drain the generation requests in progress, refuse new ones, and stop at once on a second signal.

On the first SIGTERM or SIGINT the server keeps listening while it drains, so that health checks (on
existing and new connections) answer NOT_SERVING and new generation calls get UNAVAILABLE instead of a
refused connection; the requests already accepted may finish within the grace period. Then gRPC stops
(cutting off what is left) and the engines close, all at once and within a bound (server/edge/app.py's
CLOSE_SECONDS: engine processes still running then are killed), so that the whole stop fits the preStop
pause + --grace-seconds + CLOSE_SECONDS that the manifests' terminationGracePeriodSeconds is. A second signal
cuts the drain short, or, during the close, stops waiting for it (engine processes are killed). Both
ends log what was finished and what was cut off, and the process exits 0: the signal handlers stay
installed until everything is closed, so no signal falls through to the default handler, whose
KeyboardInterrupt would leave gRPC's threads running into interpreter exit (SIGABRT).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator

from attnserve.api.generation import UnavailableError

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclasses.dataclass(frozen=True)
class DrainOutcome:
    finished: int  # requests in progress when the drain began that ended before it did
    cut_off: int  # requests still in progress when it ended


class Drain:
    """Counts the generation requests in progress; once draining, refuses new ones and awaits the rest.

    Used from the event loop only.
    """

    def __init__(self):
        self.draining = False
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def active(self) -> int:
        return self._active

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Counts one request for the duration of the block.

        Raises:
            UnavailableError: the server is draining.
        """
        if self.draining:
            raise UnavailableError("the server is shutting down; retry on another server")
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def drain(self, grace: float | None) -> DrainOutcome:
        """Refuses new requests and waits up to `grace` seconds (None: forever) for the others to end."""
        self.draining = True
        started_with = self._active
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace)
        return DrainOutcome(finished=started_with - self._active, cut_off=self._active)


async def serve_until_signal(
    drain: Callable[[], Awaitable[DrainOutcome]],
    close: Callable[[], Awaitable[None]],
    in_flight: Callable[[], int],
    grace: float | None,
    force: Callable[[], None] = lambda: None,
) -> None:
    """Waits for SIGTERM or SIGINT, drains, then closes; a second signal cuts the drain, or the close, short.

    Args:
        drain: starts the drain (health NOT_SERVING, new calls refused) and returns when it is over.
        close: stops gRPC (cutting off what is left) and closes the engines.
        in_flight: how many generation requests are in progress now.
        grace: the drain's limit, for the log line.
        force: ends what the close is still waiting for (kills engine processes), on a second signal
            during the close.
    """
    loop = asyncio.get_running_loop()
    first, second = asyncio.Event(), asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if not first.is_set():
            first.set()
        elif not second.is_set():
            logger.warning("second %s: stopping now", sig.name)
            second.set()
        else:
            logger.warning("%s ignored: already stopping", sig.name)

    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await first.wait()
        logger.info("shutting down: up to %s s for in-flight requests (a second signal stops at once)", grace)
        draining = asyncio.ensure_future(drain())
        interrupted = asyncio.ensure_future(second.wait())
        await asyncio.wait({draining, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        interrupted.cancel()
        if draining.done():
            outcome = draining.result()
            logger.info("drained: %d in-flight requests finished, %d cut off", outcome.finished, outcome.cut_off)
        else:
            draining.cancel()
            logger.warning("stopped before the drain ended: %d in-flight requests cut off", in_flight())
        if second.is_set():  # the drain was cut short: the close is already what was asked for
            await close()
            return
        closing = asyncio.ensure_future(close())
        interrupted = asyncio.ensure_future(second.wait())
        await asyncio.wait({closing, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        interrupted.cancel()
        if not closing.done():
            logger.warning("not waiting for the engines to close")
            force()
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
