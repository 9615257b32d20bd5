"""Lazy Adam: Adam whose sparse (``tf.IndexedSlices``) gradients update only the rows a batch looked up.

Keras 3's Adam applies an embedding table's ``IndexedSlices`` gradient densely: its m and v slots decay, and the
table moves, on every row at every step, so a step costs the table's size (a 10^7-row table: seconds a step,
``bench/results/train-step/``). ``LazyAdam`` follows ``tensorflow_addons.optimizers.LazyAdam``: the slices of
each looked-up row are summed (an id twice in a batch is one row with the sum of its gradients, as the dense
gradient has it), and only those rows of the variable and of its m and v are gathered, updated and scattered
back, with the bias correction of the global step; a row not looked up keeps its value and its slots unchanged
(Adam proper would decay its m and v and move it by its momentum). A dense gradient (the dense head's) gets
exactly Keras Adam's update.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def summed_slices(grad: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """(unique rows, the sum of ``grad``'s slices for each): an index repeated in a batch is one row."""
    rows, where = tf.unique(grad.indices)
    return rows, tf.math.unsorted_segment_sum(grad.values, where, tf.shape(rows)[0])


class LazyAdam(keras.optimizers.Adam):
    """Adam (``keras.optimizers.Adam``'s arguments, no ``amsgrad``) that updates a sparse gradient's rows only.

    For the rows r a batch looked up (their gradient g summed per row), at global step t (1 on the first)::

        m[r] = beta_1 * m[r] + (1 - beta_1) * g
        v[r] = beta_2 * v[r] + (1 - beta_2) * g^2
        var[r] -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m[r] / (sqrt(v[r]) + epsilon)
    """

    def __init__(self, learning_rate=0.001, **kwargs):
        if kwargs.get("amsgrad"):
            raise ValueError("LazyAdam has no amsgrad variant: use keras.optimizers.Adam(amsgrad=True)")
        super().__init__(learning_rate=learning_rate, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        if not isinstance(gradient, tf.IndexedSlices):
            super().update_step(gradient, variable, learning_rate)
            return
        dtype = variable.dtype
        rows, g = summed_slices(gradient)
        g = tf.cast(g, dtype)
        lr = tf.cast(learning_rate, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        alpha = lr * tf.sqrt(1 - tf.pow(beta_2, step)) / (1 - tf.pow(beta_1, step))
        m, v = self.moments(variable)
        # tf.gather on the tf.Variable itself (a ResourceGather): reading the whole slot as a tensor first would
        # copy it once it has had scatter updates (TensorFlow's copy-on-read mode), a step's cost the table's size
        m_rows = beta_1 * tf.gather(_tf_variable(m), rows) + (1 - beta_1) * g
        v_rows = beta_2 * tf.gather(_tf_variable(v), rows) + (1 - beta_2) * tf.square(g)
        self.assign(m, tf.IndexedSlices(m_rows, rows))
        self.assign(v, tf.IndexedSlices(v_rows, rows))
        step_rows = alpha * m_rows / (tf.sqrt(v_rows) + tf.cast(self.epsilon, dtype))
        self.assign_sub(variable, tf.IndexedSlices(step_rows, rows))

    def moments(self, variable) -> tuple[keras.Variable, keras.Variable]:
        """(m, v): ``variable``'s first and second moment slots."""
        index = self._get_variable_index(variable)
        return self._momentums[index], self._velocities[index]

    def get_config(self):
        config = super().get_config()
        config.pop("amsgrad", None)
        return config


def _tf_variable(variable) -> tf.Variable:
    """The ``tf.Variable`` behind a Keras variable (the TensorFlow backend's ``.value``), or ``variable`` itself."""
    return variable.value if isinstance(variable, keras.Variable) else variable
