"""A loaded SavedModel signature called with its inputs as one flat list of tensors.

A signature called with keyword arguments goes through TensorFlow's structured-signature path, which
checks, converts and flattens the arguments in Python on every call, a large share of the dense head's
call at N = 1000 (measured in ``bench/results/serve-latency-candidate-cache/``). A signature's flat inputs are its
keyword arguments in sorted order (as ``tf.nest`` flattens a dict), then the captured variables, and
``ConcreteFunction._call_flat`` takes them as they are. That entry is TensorFlow's own, not a public one,
so it is used only where the signature's placeholders carry the keyword names in exactly that order;
anything else (another TensorFlow, a signature whose tensor names differ from its keywords) takes the
keyword call. Either way the tensors are built with the signature's dtypes, and a missing or extra input
is a TypeError naming it.

One step further (``direct``): ``_call_flat`` itself checks for a gradient tape, resolves the captured
variables and packs the outputs on every call; a serving call records no gradient and its variables never
change, so the function's inference entry is called with the captures resolved once, and the flat outputs
named by the signature's output keys in sorted order (``tf.nest``'s order). That is taken only when a probe
at construction gives exactly what ``_call_flat`` gives; else every call goes through ``_call_flat``
(``bench/results/serve-latency-lean/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

PROBE_ROWS = 3
"""Rows of the probe that checks the direct entry against ``_call_flat`` (a dimension the signature leaves open)."""


class SignatureCall:
    """``call(inputs) -> {output name: tensor}`` of one signature (a ``ConcreteFunction`` of a loaded SavedModel)."""

    def __init__(self, fn: Any):
        self._fn = fn
        args, kwargs = fn.structured_input_signature
        self._specs: dict[str, tf.TensorSpec] = dict(kwargs)
        self._names = sorted(self._specs)
        n = len(fn.inputs) - len(fn.captured_inputs)
        placeholders = [t.name.split(":")[0] for t in fn.inputs[:n]]
        self.flat = not args and hasattr(fn, "_call_flat") and placeholders == self._names
        self.direct = self.flat and self._probe_direct()

    @property
    def shapes(self) -> dict[str, list[int | None]]:
        """{input name: its shape} (``None``: a dimension the signature leaves open)."""
        return {k: s.shape.as_list() for k, s in self._specs.items()}

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        if inputs.keys() != self._specs.keys():
            missing, extra = sorted(self._specs.keys() - inputs.keys()), sorted(inputs.keys() - self._specs.keys())
            raise TypeError(f"signature inputs: missing {missing}, unexpected {extra}")
        specs = self._specs
        return self._run([tf.constant(inputs[k], dtype=specs[k].dtype) for k in self._names], self.direct)

    def _run(self, tensors: list[tf.Tensor], direct: bool) -> dict[str, tf.Tensor]:
        """The call of the inputs as tensors in sorted keyword order: the direct entry, the flat one or the keywords."""
        if direct:
            return dict(zip(self._outputs, self._entry(*tensors, *self._captures)))
        if not self.flat:
            return self._fn(**dict(zip(self._names, tensors)))
        return self._fn._call_flat(tensors, self._fn.captured_inputs)

    def _probe_direct(self) -> bool:
        """Set up the direct entry, and whether a probe through it gives exactly what ``_call_flat`` gives."""
        entry = getattr(self._fn, "_inference_function", None)
        outputs = getattr(self._fn, "structured_outputs", None)
        if entry is None or not hasattr(entry, "call_flat") or not isinstance(outputs, dict):
            return False
        if not all(s.dtype.is_floating for s in self._specs.values()):
            return False  # the probe draws floats: a head with other inputs keeps _call_flat
        self._entry, self._outputs = entry.call_flat, sorted(outputs)
        self._captures = list(self._fn.captured_inputs)
        if not all(isinstance(c, tf.Tensor) for c in self._captures):
            return False  # a distributed variable: _call_flat resolves its handle on every call
        rng = np.random.default_rng(0)
        probe = {
            k: rng.normal(size=[PROBE_ROWS if d is None else d for d in s.shape.as_list()]).astype(
                s.dtype.as_numpy_dtype
            )
            for k, s in self._specs.items()
        }
        tensors = [tf.constant(probe[k]) for k in self._names]
        want = self._run(tensors, direct=False)
        try:
            got = self._run(tensors, direct=True)
        except Exception:  # noqa: BLE001 - any failure of the private entry means: do not use it
            return False
        return want.keys() == got.keys() and all(np.array_equal(want[k].numpy(), got[k].numpy()) for k in want)
