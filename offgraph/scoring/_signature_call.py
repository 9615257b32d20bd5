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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf


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

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        if inputs.keys() != self._specs.keys():
            missing, extra = sorted(self._specs.keys() - inputs.keys()), sorted(inputs.keys() - self._specs.keys())
            raise TypeError(f"signature inputs: missing {missing}, unexpected {extra}")
        tensors = {k: tf.constant(v, dtype=self._specs[k].dtype) for k, v in inputs.items()}
        if not self.flat:
            return self._fn(**tensors)
        return self._fn._call_flat([tensors[k] for k in self._names], self._fn.captured_inputs)
