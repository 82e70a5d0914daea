"""A fused kernel with its gradient, callable eagerly and inside torch.compile.

Dynamo cannot trace into a pybind call (the C++ kernels) and would have to trace Triton's launcher (the Triton
kernel): either splits a compiled model's graph. Registered as PyTorch operators (`torch.library.custom_op`) with
a fake implementation (the outputs' shapes) and their gradient, the kernels are opaque calls inside one graph, and
AOTAutograd traces the backward through the registered one.

Eagerly an operator with a Python gradient costs about 50 microseconds more per forward and backward than an
autograd.Function (measured on the C++ attention kernel at 16 keys: 185 against 96 us a call), which a block
pattern's many small calls would feel. So `KernelOperator` calls the same forward and backward through an
autograd.Function outside torch.compile, and through the operators inside it; the compile tests compare the two.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.autograd import Function

# (ctx, inputs, outputs) -> None: what the backward needs, saved on ctx.
SaveForBackward = Callable[..., None]
# (ctx, grad_outputs, backward) -> one gradient (or None) per input of the forward.
Gradients = Callable[..., tuple]


class KernelOperator:
    """`forward` (tensors and scalars -> the result, or a tuple of tensors: the result and what the backward reads)
    and `backward` as the operators sparse_runner::<name> and sparse_runner::<name>_backward.

    Calling it runs forward with autograd: `save(ctx, inputs, outputs)` keeps what the backward needs, and
    `gradients(ctx, grad_outputs, backward)` returns the inputs' gradients, calling `backward` (the plain function
    eagerly, its operator under torch.compile). Only the first output takes a gradient; the others are internal.
    forward's and backward's outputs must be fresh tensors (an operator's outputs may not alias its inputs or each
    other); fake_forward and fake_backward return empty tensors of their shapes, dtypes and strides. (A result
    alone, not a 1-tuple: torch 2.13 specialises a traced length that reaches an operator returning a 1-tuple,
    one recompile per length, and not one returning a tensor.)
    """

    def __init__(self, name: str, forward: Callable, backward: Callable, *, fake_forward: Callable, fake_backward: Callable,
                 save: SaveForBackward, gradients: Gradients, device_types: str | None = None):
        self.forward_op = torch.library.custom_op(f"sparse_runner::{name}", forward, mutates_args=(), device_types=device_types)
        self.backward_op = torch.library.custom_op(f"sparse_runner::{name}_backward", backward, mutates_args=(), device_types=device_types)
        self.forward_op.register_fake(fake_forward)
        self.backward_op.register_fake(fake_backward)
        self.forward_op.register_autograd(lambda ctx, *grads: gradients(ctx, grads, self.backward_op),
                                          setup_context=lambda ctx, inputs, output: save(ctx, inputs, output))

        class Eager(Function):
            @staticmethod
            def forward(ctx, *inputs):
                outputs = forward(*inputs)
                ctx.n_inputs = len(inputs)
                ctx.set_materialize_grads(False)  # the internal outputs get no gradient, not zeros of their size
                if isinstance(outputs, tuple):
                    ctx.mark_non_differentiable(*outputs[1:])
                save(ctx, inputs, outputs)
                return outputs

            @staticmethod
            def backward(ctx, *grads):
                if grads[0] is None:  # the result took no part in what is differentiated
                    return (None,) * ctx.n_inputs
                return gradients(ctx, grads, backward)

        Eager.__name__ = Eager.__qualname__ = f"{name}_eager"
        self._eager = Eager

    def __call__(self, *inputs) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if torch.compiler.is_compiling():
            return self.forward_op(*inputs)
        return self._eager.apply(*inputs)
