"""One orbax checkpoint operation at a time in a process (`LOCK`).

orbax numbers every save and restore with a process-global operation id
(`orbax.checkpoint._src.futures.synchronization.OperationIdGenerator`: a class attribute, not per
thread), and the parts of an operation read it back to name the signals they wait for. Two
operations started in threads side by side (`gqa-spec reproduce`'s `workers`) then wait for each
other's signals until orbax's 300 s timeout ("Timeout waiting for key
'awaitable_signals_contract_10/step_directory_creation'", seen in the suite). The parts capture the
id when they are created, inside the call that starts the operation, so an asynchronous save needs
the lock only while its `save` call runs, not while it commits in the background. Every orbax call
of this package holds `LOCK`.
"""

import threading

LOCK = threading.RLock()
