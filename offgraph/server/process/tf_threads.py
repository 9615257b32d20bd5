"""TensorFlow's thread pools, set explicitly before any TF op runs."""

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
