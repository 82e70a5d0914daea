"""The ListOps generator of the Long Range Arena (LRA): random expression trees, their values and text.

ListOps (LRA paper, section D.4 of the reference notes) asks a model to evaluate a nested expression of
list operators over the digits 0-9, e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]`` -> 9; the label is the value
(10 classes).

* ``generate_examples``: the LRA generator (random trees, kept only if ``min_length < length < max_length``,
  deduplicated) with a seeded ``random.Random`` so the same seed gives the same data.
* ``tree_to_string``: the release's text form (``( ( ( [MAX 2 ) 9 ) ] )``), which ``listops_files``
  tokenises.

Tree representation
-------------------
A leaf is an ``int`` 0-9. An operator node is a tuple ``(op, children)`` with ``op`` one of
``OPERATORS`` (without the ``[``) and ``children`` a tuple of at least two subtrees. This is more
direct to evaluate than LRA's binary nesting, which only matters for the serialised text.

An impossible generator setting raises a one-line ``ConfigError`` naming the parameter.
Pure Python on purpose: data preparation must not depend on torch.
"""

from __future__ import annotations

import random
from typing import Union

from sparse_runner.checks import ConfigError

OPERATORS: tuple[str, ...] = ("MIN", "MAX", "MED", "SM")

#: Probability that a node (above max_depth) becomes an operator; LRA's VALUE_P = 0.25 means
#: "r > 0.25 -> leaf", so an operator is drawn when r <= 0.25.
VALUE_P = 0.25

Tree = Union[int, tuple]  # int leaf, or (op: str, children: tuple[Tree, ...])


# ----------------------------------------------------------------------------------------------------
# Trees
# ----------------------------------------------------------------------------------------------------


class _TooLong(Exception):
    """Raised inside the sampler once a tree has reached max_length (it cannot be kept)."""


def _make_tree_sampler(rng: random.Random, *, max_depth: int, max_args: int, length_limit: float):
    """Return ``sample() -> (tree, length)`` drawing LRA trees from ``rng``.

    ``sample`` raises ``_TooLong`` once the running length reaches ``length_limit`` (checked at each
    operator node): such a tree would be rejected anyway, and stopping early skips the (heavy-tailed)
    work of finishing it. This keeps the
    distribution of kept trees exactly LRA's: the draws are i.i.d., so restarting after a stopping time
    gives the same independent sequence of trees; only *which* trees a given seed yields differs from a
    sampler that finishes every tree.

    Written as a closure over local names because this is the hot loop of data generation.
    """
    uniform = rng.random
    extra_args = max_args - 1  # number of possible child counts 2..max_args
    operators = OPERATORS
    num_ops = len(operators)
    length = 0

    def operator_node(depth: int) -> tuple:
        """An operator node at ``depth`` (the caller has already decided it is not a leaf)."""
        nonlocal length
        length += 2  # the operator token and its closing "]"
        if length >= length_limit:
            raise _TooLong
        # LRA draws the argument count with Python's random.randint(2, max_args), which is
        # INCLUSIVE: 2..max_args children (checked against lra_benchmarks/data/listops.py, which
        # imports the stdlib `random`, not numpy). We follow the released generator. Drawn as
        # 2 + int(u * (max_args - 1)) because rng.randint costs more than the rest of the node.
        num_children = 2 + int(uniform() * extra_args)
        child_depth = depth + 1
        # At depth == max_depth a leaf is forced and, as in LRA, no random number is drawn for it.
        can_branch = child_depth < max_depth
        children = []
        # Children are drawn inline rather than by a call per child: most nodes are leaves, and a
        # Python call per leaf was the largest cost of generation.
        for _ in range(num_children):
            if can_branch and uniform() <= VALUE_P:  # LRA: r > VALUE_P -> leaf
                children.append(operator_node(child_depth))
            else:
                length += 1
                children.append(int(uniform() * 10))  # uniform digit 0-9 (cheaper than rng.choice)
        if length >= length_limit:
            raise _TooLong
        # Uniform over the four operators; int(u * n) has a bias of order 2**-53, i.e. none.
        return (operators[int(uniform() * num_ops)], tuple(children))

    def sample() -> tuple[Tree, int]:
        nonlocal length
        length = 0
        # LRA starts the recursion at depth 1; the root follows the same leaf/operator rule.
        if 1 < max_depth and uniform() <= VALUE_P:
            return operator_node(1), length
        return int(uniform() * 10), 1

    return sample


def generate_tree(rng: random.Random, *, max_depth: int, max_args: int) -> Tree:
    """Draw one LRA ListOps tree (no length limit). Mainly for tests and exploration."""
    _check_tree_params(max_depth=max_depth, max_args=max_args)
    tree, _ = _make_tree_sampler(rng, max_depth=max_depth, max_args=max_args, length_limit=float("inf"))()
    return tree


def _median_truncated(values: list[int]) -> int:
    """``int(np.median(values))`` without numpy's per-call overhead (values are non-negative ints).

    For an even count numpy's median is the mean of the two middle values; int() truncates it, which for
    non-negative numbers is floor division.
    """
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) // 2


def evaluate(tree: Tree) -> int:
    """Value (0-9) of a tree: MIN, MAX, MED = int(np.median) (truncated), SM = sum % 10."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    # Leaves inline (most children are leaves; a call each would dominate the cost).
    values = [child if child.__class__ is int else evaluate(child) for child in children]
    if op == "MIN":
        return min(values)
    if op == "MAX":
        return max(values)
    if op == "MED":
        return _median_truncated(values)
    if op == "SM":
        return sum(values) % 10
    raise ValueError(f"unknown ListOps operator {op!r}; expected one of {', '.join(OPERATORS)}")


def tree_length(tree: Tree) -> int:
    """Number of tokens after tokenisation: 1 per leaf, 2 per operator node (operator and ``]``)."""
    if isinstance(tree, int):
        return 1
    return 2 + sum(tree_length(child) for child in tree[1])


_DIGIT_TEXT = tuple(str(d) for d in range(10))


def _serialise(tree: tuple, out: list[str]) -> None:
    """Append the text pieces of operator node ``tree`` to ``out`` (joined with spaces by the caller)."""
    op, children = tree
    # LRA nests an operator with children c1..ck as ((...((op c1) c2)...ck) ]) and writes every binary
    # pair (A, B) as "( A B )": so k+1 opening parentheses, then "[op", then each child followed by
    # the ")" that closes its pair, then "] )".
    out.append("( " * (len(children) + 1) + "[" + op)
    for child in children:
        if child.__class__ is int:  # leaves inline: most nodes are leaves
            out.append(_DIGIT_TEXT[child])
        else:
            _serialise(child, out)
        out.append(")")
    out.append("] )")


def tree_to_string(tree: Tree) -> str:
    """LRA release text of a tree, e.g. MAX(2, 9) -> ``"( ( ( [MAX 2 ) 9 ) ] )"``."""
    if isinstance(tree, int):
        return str(tree)
    out: list[str] = []
    _serialise(tree, out)
    return " ".join(out)


def _check_tree_params(*, max_depth: int, max_args: int) -> None:
    if max_depth < 1:
        raise ConfigError(f"max_depth must be >= 1, got {max_depth}")
    if max_args < 2:
        raise ConfigError(f"max_args must be >= 2 (an operator has 2..max_args children), got {max_args}")


def generate_examples(
    num_examples: int,
    *,
    min_length: int,
    max_length: int,
    max_depth: int,
    max_args: int,
    seed: int,
    max_consecutive_rejects: int = 1_000_000,
) -> list[tuple[str, int]]:
    """Generate ``num_examples`` distinct ``(source_text, label)`` pairs, LRA style.

    A tree is kept only if ``min_length < tree_length < max_length`` (strict, as in LRA) and its text has
    not been seen before. Examples are returned in generation order, so the result is a deterministic
    function of the arguments (LRA instead split in set-iteration order, which is not reproducible).

    Raises ``ConfigError`` for a parameter out of range, and if ``max_consecutive_rejects`` trees in a row
    are rejected, which means the length window is (nearly) impossible for these tree parameters or its
    distinct trees are exhausted.
    """
    if num_examples < 0:
        raise ConfigError(f"num_examples must be >= 0, got {num_examples}")
    if not 0 <= min_length < max_length:
        raise ConfigError(f"need 0 <= min_length < max_length, got min_length={min_length}, max_length={max_length}")
    _check_tree_params(max_depth=max_depth, max_args=max_args)

    rng = random.Random(seed)
    sample = _make_tree_sampler(rng, max_depth=max_depth, max_args=max_args, length_limit=max_length)
    seen: set[str] = set()
    examples: list[tuple[str, int]] = []
    rejects = 0
    while len(examples) < num_examples:
        try:
            tree, length = sample()
        except _TooLong:
            length = max_length  # reached max_length: rejected below
            tree = None
        if length <= min_length or length >= max_length:
            rejects += 1
        else:
            text = tree_to_string(tree)
            if text in seen:
                rejects += 1
            else:
                seen.add(text)
                examples.append((text, evaluate(tree)))
                rejects = 0
        if rejects >= max_consecutive_rejects:
            # The settings, not the code, are at fault: too few distinct trees fit the window.
            raise ConfigError(
                f"ListOps generator rejected {rejects} trees in a row after {len(examples)} of {num_examples} "
                f"examples (min_length={min_length}, max_length={max_length}, max_depth={max_depth}, "
                f"max_args={max_args}): too few distinct trees fit; widen the length window or ask for fewer examples"
            )
    return examples
