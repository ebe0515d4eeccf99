"""trainwatch: stream one health record per optimizer step to a trainwatch server.

    import trainwatch
    with trainwatch.Client("127.0.0.1:50051", run="llama/run-42",
                           precision="bf16", max_norm=1.0) as tw:
        for step in ...:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            tw.record(step, grad_norm=norm, loss=loss, lr=lr)
        tw.event("run_finished", step)

A binding of the C++ client (client/include/trainwatch/client.h): record()
puts the step into a bounded lock-free queue and returns; a background thread
batches, streams, reconnects and resends whatever the server has not
acknowledged. record() never blocks and never waits for the GPU:

* floats, ints, bools (and numpy.float64) go straight to the C++ queue in
  one call (about 0.5 us);
* other numpy scalars and CPU tensors are converted first (``.item()`` on a
  CPU tensor reads memory, no sync; about 0.5 us per tensor);
* CUDA tensors are copied with ``non_blocking=True`` into pinned host memory
  behind a ``torch.cuda.Event``; the step waits in a small pending list and
  is handed to the C++ queue by a later record(), event(), flush() or close()
  once its event has completed. Steps and events keep their order.

Thread-safety: a Client may be used from one thread at a time (the training
loop). stats may be read from any thread.
"""

from . import _fields, client, control, restart
from ._fields import DIRECTIVE_STATES, EVENT_KINDS, FP8_FORMATS, LAYER_KINDS, MOE_BALANCING
from .client import Client, Stats
from .control import EXIT_RESTART, Boundary, Control
from .restart import SkipBatches, restart_plan

# Every module's public names (trainwatch.torch and trainwatch.fp8 import
# torch: they are imported by name, not here).
__all__ = [*client.__all__, *_fields.__all__, *control.__all__, *restart.__all__]
