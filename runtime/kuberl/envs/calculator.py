"""The built-in `calculator` tool: arithmetic on numbers, evaluated by walking the expression's syntax tree.

Nothing is ever passed to eval: the expression is parsed with `ast`, and only number literals, + - * / // % **
(and ^ read as **), unary + and -, and parentheses are evaluated; a name, a call, an attribute or anything else is
refused. Sizes are bounded, so that a model cannot make it compute for ever (9 ** 9 ** 9) or fill memory.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 500
MAX_INT_BITS = 4096  # an integer result or operand larger than this (about 1233 digits) is refused
BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY: dict[type, Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
ALLOWED = "numbers, + - * / // % ** (or ^), and parentheses"


class CalculatorError(ValueError):
    """The expression is not arithmetic, or its value cannot be computed (division by zero, too large)."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. "(2 + 3) * 4 / 5" -> "4"."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, not {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is {len(expression)} characters, more than {MAX_EXPRESSION_CHARS}")
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/").replace("−", "-").strip()
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"cannot parse {expression!r}: only {ALLOWED}") from exc
    return format_number(evaluate(tree.body))


def evaluate(node: ast.AST) -> int | float:
    """The value of an arithmetic syntax tree; CalculatorError for any other node."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _bounded(BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise CalculatorError(f"{what} is not allowed: only {ALLOWED}")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse a power whose result would be too large to compute quickly (an integer of more than MAX_INT_BITS
    bits), or that is complex (a negative number to a fractional power)."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS:
            raise CalculatorError("the result is too large")
    if base < 0 and not float(exponent).is_integer():
        raise CalculatorError("a negative number to a fractional power is not a real number")


def _bounded(value: int | float) -> int | float:
    """`value`, if it is a finite number of bounded size."""
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is too large")
    return value


def format_number(value: int | float) -> str:
    """An integer in full; a float with up to 12 significant digits, whole floats without a fraction (6 / 3 -> 2)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)
