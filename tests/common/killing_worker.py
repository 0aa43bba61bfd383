"""A pool job wrapper that kills its own worker (SIGKILL, as the out-of-memory killer does) on a file whose
name holds `kill_me`. Tests put it in place of `common.workers._Tracked`: the pool pickles the wrapper by
this module's name, so it reaches spawned workers as well as forked ones."""

from __future__ import annotations

import os
import signal
from typing import Any

from common.workers import _Tracked

MARK = "kill_me"


def _die(job: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillOnMarkedFile(_Tracked):
    def __call__(self, item: tuple[str, Any]) -> Any:
        if MARK in os.path.basename(item[0]):
            self.fn = _die  # after the marker is written, as a real kill in the middle of the file
        return super().__call__(item)
