"""`prime_math`: equivalent final answers grade equal, as upstream's grader grades them."""

import pytest

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.prime_math import compute_score, grader

BMATRIX = "\\begin{bmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19 \n \\end{bmatrix}"
PMATRIX = "\\begin{pmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19\n \\end{pmatrix}"


@pytest.mark.parametrize(
    "answer, reference",
    [
        (BMATRIX, PMATRIX),  # same entries, other brackets
        ("\\begin{pmatrix} 1/2 & \\frac{3}{4} \\end{pmatrix}", "\\begin{bmatrix}0.5&0.75\\end{bmatrix}"),
        ("x^2 + y^2 + 4x - 6y + 13", "(x + 2)^2 + (y - 3)^2 "),  # expanded vs completed squares
        ("\\frac{\\sqrt{505}}{7}", "\\frac{\\sqrt{505}}{7}"),
    ],
)
def test_equivalent_answers_are_correct(answer, reference):
    assert compute_score(answer, reference)[0] is True
    assert default_compute_score("numina_aops_forum", answer, reference) == 1.0


@pytest.mark.parametrize(
    "answer, reference",
    [
        (BMATRIX.replace("19", "18"), PMATRIX),  # one entry differs
        ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),  # transposed shape
        ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "(1, 2)"),  # a matrix is not a tuple
        ("x^2 + y^2 + 4x - 6y + 12", "(x + 2)^2 + (y - 3)^2"),
    ],
)
def test_different_answers_are_wrong(answer, reference):
    assert compute_score(answer, reference)[0] is False


def test_matrix_entries_of_the_grader():
    assert grader.matrix_entries(PMATRIX) == [["-7", "6", "-8"], ["11", "-9", "12"], ["15", "-16", "19"]]
    assert grader.matrix_entries("\\begin{vmatrix} a \\end{vmatrix}") == [["a"]]
    assert grader.matrix_entries("(1, 2)") is None
