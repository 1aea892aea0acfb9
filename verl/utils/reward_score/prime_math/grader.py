"""Numeric and symbolic equality of two final answers (our own grader; the name `math_equal`
and its keywords follow upstream's ``prime_math.grader``).

`math_equal(prediction, reference)` is True when

1. the normalised strings are equal, or
2. both are numbers (``1,000``, ``50%``, ``3.0``, ``\\frac{1}{2}``) equal within a relative
   tolerance of 1e-4 (with `include_percentage`, ``50`` also matches ``0.5`` and ``5000``), or
3. both are tuples / intervals of the same brackets and length, or LaTeX matrices of the same
   shape (any of the ``*matrix`` environments), whose elements are pairwise equal, or
4. sympy proves ``prediction - reference == 0`` (also for equations ``a = b`` vs ``c = d`` up to a
   factor), within `timeout` seconds when `timeout` is true (SIGALRM, main thread only).

``\\pi`` is substituted by the number `pi` before numeric checks.
"""

from __future__ import annotations

import math
import re
import signal
import threading
from contextlib import contextmanager

from .math_normalize import normalize_answer

__all__ = ["math_equal", "matrix_entries", "to_number", "latex_to_sympy_text", "symbolic_equal"]

_SYMPY_SECONDS = 5.0


def _replace_braced(text: str, command: str, arity: int, render) -> str:
    """Replace ``\\command{a}{b}`` (brace-balanced arguments) by ``render(a, b)``."""
    out, i = [], 0
    while True:
        j = text.find(command, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = j + len(command)
        args = []
        for _ in range(arity):
            while k < len(text) and text[k] == " ":
                k += 1
            if k < len(text) and text[k] == "{":
                depth, start = 0, k
                while k < len(text):
                    depth += text[k] == "{"
                    depth -= text[k] == "}"
                    k += 1
                    if depth == 0:
                        break
                args.append(text[start + 1 : k - 1])
            elif k < len(text):  # \frac12: single-character arguments
                args.append(text[k])
                k += 1
            else:
                args.append("")
        out.append(render(*args))
        i = k


def latex_to_sympy_text(expr: str) -> str:
    """Translate the LaTeX of a typical final answer into text `sympy.parse_expr` reads."""
    s = expr.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\sqrt\[(.+?)\]", lambda m: f"\\root{{{m.group(1)}}}", s)
    s = _replace_braced(s, "\\root", 2, lambda n, x: f"(({x})**(1/({n})))")
    s = _replace_braced(s, "\\frac", 2, lambda a, b: f"(({a})/({b}))")
    s = _replace_braced(s, "\\sqrt", 1, lambda a: f"sqrt({a})")
    for latex, plain in (
        ("\\cdot", "*"),
        ("\\times", "*"),
        ("\\div", "/"),
        ("\\pi", "pi"),
        ("\\infty", "oo"),
        ("\\!", ""),
        ("\\,", ""),
        ("\\ ", ""),
    ):
        s = s.replace(latex, plain)
    s = s.replace("^", "**").replace("{", "(").replace("}", ")")
    return s.replace("\\", "")


def to_number(text: str, pi: float = math.pi) -> float | None:
    """The value of a numeric answer (``1,234``, ``-.5``, ``50\\%``, ``\\frac{3}{4}``, ``2\\pi``) or None."""
    s = str(text).strip().replace("$", "").replace("\\%", "%").replace(" ", "")
    percent = s.endswith("%")
    s = s.rstrip("%")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    try:
        value = float(s)
    except ValueError:
        if not re.fullmatch(r"[-+*/()0-9.\\a-z{}^]*", s) or len(s) > 60:
            return None
        try:
            import sympy
            from sympy.parsing.sympy_parser import (
                implicit_multiplication_application,
                parse_expr,
                standard_transformations,
            )

            parsed = parse_expr(
                latex_to_sympy_text(s),
                local_dict={"pi": sympy.Float(pi)},
                transformations=standard_transformations + (implicit_multiplication_application,),
            )
            if parsed.free_symbols:
                return None
            value = float(parsed.evalf())
        except Exception:  # noqa: BLE001 - not a number
            return None
    return value / 100.0 if percent else value


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-8)


@contextmanager
def _time_limit(seconds: float | None):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise TimeoutError(f"symbolic comparison exceeded {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def symbolic_equal(a: str, b: str, timeout: float | None = None) -> bool:
    """sympy decides ``a - b == 0`` (equations: the sides' differences are proportional)."""
    import sympy
    from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

    transformations = standard_transformations + (implicit_multiplication_application,)

    def parse(text: str):
        return parse_expr(latex_to_sympy_text(text), transformations=transformations, evaluate=True)

    try:
        with _time_limit(timeout):
            if a.count("=") == 1 and b.count("=") == 1:
                (la, ra), (lb, rb) = a.split("="), b.split("=")
                da, db = parse(la) - parse(ra), parse(lb) - parse(rb)
                if db == 0:
                    return bool(da == 0)
                ratio = sympy.simplify(da / db)
                return bool(ratio.is_number and ratio != 0)
            return bool(sympy.simplify(parse(a) - parse(b)) == 0)
    except Exception:  # noqa: BLE001 - unparsable or too slow: not equal
        return False


_BRACKETS = {"(": ")", "[": "]", "\\{": "\\}"}


def _split_elements(text: str) -> tuple[str, str, list[str]] | None:
    """(open, close, top-level comma-separated elements) of a tuple/interval, else None."""
    s = text.strip()
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
        return None
    inner, parts, depth, start = s[1:-1], [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return (s[0], s[-1], [p.strip() for p in parts]) if len(parts) > 1 else None


_MATRIX = re.compile(r"^\\begin\{([pbvBV]?matrix)\}(.*)\\end\{\1\}$", re.S)


def matrix_entries(text: str) -> list[list[str]] | None:
    """Rows of entries of a LaTeX ``matrix`` / ``pmatrix`` / ``bmatrix`` / ``vmatrix`` /
    ``Bmatrix`` / ``Vmatrix`` (rows split at ``\\\\``, entries at ``&``; the brackets do not
    matter), else None."""
    match = _MATRIX.match(str(text).strip())
    if match is None:
        return None
    rows = [row.strip() for row in match.group(2).split("\\\\")]
    while rows and not rows[-1]:
        rows.pop()  # a trailing row break
    return [[entry.strip() for entry in row.split("&")] for row in rows]


def math_equal(
    prediction,
    reference,
    include_percentage: bool = True,
    is_close: bool = True,
    timeout: bool = False,
    pi: float = math.pi,
) -> bool:
    """True when `prediction` and `reference` denote the same answer (see the module docstring)."""
    if prediction is None or reference is None:
        return False
    pred, ref = str(prediction).strip(), str(reference).strip()
    if pred == ref or normalize_answer(pred) == normalize_answer(ref):
        return True
    pv, rv = to_number(pred, pi), to_number(ref, pi)
    if pv is not None and rv is not None:
        candidates = [rv, rv / 100.0, rv * 100.0] if include_percentage else [rv]
        return any(_close(pv, c) if is_close else pv == c for c in candidates)
    pm, rm = matrix_entries(pred), matrix_entries(ref)
    if pm is not None or rm is not None:
        if pm is None or rm is None or [len(r) for r in pm] != [len(r) for r in rm]:
            return False
        return all(
            math_equal(x, y, include_percentage, is_close, timeout, pi)
            for prow, rrow in zip(pm, rm, strict=True)
            for x, y in zip(prow, rrow, strict=True)
        )
    pt, rt = _split_elements(pred), _split_elements(ref)
    if pt is not None and rt is not None:
        if (pt[0], pt[1]) != (rt[0], rt[1]) or len(pt[2]) != len(rt[2]):
            return False
        return all(
            math_equal(x, y, include_percentage, is_close, timeout, pi) for x, y in zip(pt[2], rt[2], strict=False)
        )
    if len(pred) > 200 or len(ref) > 200:
        return False
    return symbolic_equal(pred, ref, timeout=_SYMPY_SECONDS if timeout else None)
