"""The compute thread pools of a serving process, set explicitly: TensorFlow's (before any TF op runs) and NumPy's
BLAS (OpenBLAS's threads, through threadpoolctl: the NumPy dense head's matmuls, ``offgraph.scoring.numpy_head``).

A worker's concurrency comes from its scoring threads and from more workers, so one thread a pool is the
serving default (``offgraph serve``): a multi-threaded matmul waits for its helper thread's time slice on a busy
machine, and the NumPy head lost 3-12x to the SavedModel from 200 candidates up with OpenBLAS's 2 threads, while
with one it wins at every N (bench/results/dense-head).
"""

from __future__ import annotations

import logging

log = logging.getLogger("offgraph.server")


def configure_tf_threads(intra: int | None, inter: int | None) -> dict[str, int]:
    """Set TF's intra-op / inter-op pool sizes (None: leave as is); returns the sizes in effect.

    Raises ValueError if TF already ran an op with other settings (they cannot change after that).
    """
    import tensorflow as tf

    threading = tf.config.threading
    changed = False
    for what, want, get, set_ in (
        ("intra-op", intra, threading.get_intra_op_parallelism_threads, threading.set_intra_op_parallelism_threads),
        ("inter-op", inter, threading.get_inter_op_parallelism_threads, threading.set_inter_op_parallelism_threads),
    ):
        if want is None or get() == want:
            continue
        try:
            set_(want)
            changed = True
        except RuntimeError as e:
            raise ValueError(
                f"cannot set TensorFlow's {what} threads to {want}: TensorFlow is already "
                f"initialized ({e}); set them before any TF op runs"
            ) from None
    effective = {
        "intra_op": threading.get_intra_op_parallelism_threads(),
        "inter_op": threading.get_inter_op_parallelism_threads(),
    }
    log.log(
        logging.INFO if changed else logging.DEBUG,
        "TensorFlow threads: intra-op %d, inter-op %d (0: TF's default)",
        effective["intra_op"],
        effective["inter_op"],
    )
    return effective


def configure_blas_threads(threads: int | None) -> int | None:
    """Limit NumPy's BLAS to ``threads`` threads for the rest of the process (None: leave it as is); returns the
    threads in effect (None: no BLAS library found loaded)."""
    import numpy  # noqa: F401 (its BLAS must be loaded to be found)
    from threadpoolctl import threadpool_info, threadpool_limits

    if threads is not None:
        threadpool_limits(limits=threads, user_api="blas")  # kept: not used as a context manager
    counts = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    effective = max(counts) if counts else None
    log.log(logging.INFO if threads is not None else logging.DEBUG, "BLAS threads: %s", effective)
    return effective
