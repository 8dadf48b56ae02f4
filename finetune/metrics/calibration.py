"""Calibration of classifiers, from fp32 logits (torch, float64 arithmetic): expected calibration error,
the Brier score, the reliability bins behind both, and the temperature that calibrates a softmax.

- ECE: `ECE_BINS` equal-width bins of the confidence (the largest probability; bin b holds
  confidences in (b/15, (b+1)/15], the first also 0), and the sum over bins of
  |accuracy - mean confidence| x (the bin's rows / all rows) (Guo et al., 2017).
- Brier: the multi-class Brier score, the mean over rows of sum_k (p_k - y_k)^2 with y one-hot
  (0 to 2; Brier's 1950 definition). Multi-label: each label's sigmoid p as a binary problem, with the
  binary Brier score mean((p - y)^2) (0 to 1) and ECE over the confidence max(p, 1 - p) of the
  prediction p >= 0.5; `ece` and `brier` are then the means over labels.
- Temperature: the T > 0 that minimizes the negative log-likelihood of softmax(logits / T) (multi-label:
  of every label's sigmoid(logits / T), one T shared by all labels), found by a golden-section search over
  log T in [log 0.01, log 100] (NLL is convex in 1/T, so unimodal in log T). A T at either end of that
  range is the range's limit, not an estimate (`temperature_bound`).
- Cross-fitting (`cross_fitted_logits`): each fold of the rows divided by the T fit on the other folds,
  so figures measured on them are held out from the fit.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ECE_BINS = 15
CALIBRATION_METRICS = ("ece", "brier")
TEMPERATURE_RANGE = (0.01, 100.0)
_AT_BOUND_LOG = 1e-6  # T within 1 ppm of a limit: the NLL was still falling there
_SEARCH_STEPS = 80  # the bracket shrinks by 0.618 per step: 9.2 x 0.618^80 < 1e-15 in log T


def reliability_bins(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> dict:
    """Per equal-width confidence bin: rows, mean confidence and accuracy (0 for an empty bin)."""
    confidence, correct = confidence.double(), correct.double()
    index = (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)
    rows = torch.bincount(index, minlength=bins).double()
    confidence_sum = torch.bincount(index, weights=confidence, minlength=bins)
    correct_sum = torch.bincount(index, weights=correct, minlength=bins)
    filled = rows.clamp(min=1)
    return {"rows": rows, "confidence": confidence_sum / filled, "accuracy": correct_sum / filled}


def ece_of(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    """Expected calibration error of predictions made with `confidence`, `correct` (0/1) each."""
    if len(confidence) == 0:
        return 0.0
    found = reliability_bins(confidence, correct, bins)
    weight = found["rows"] / len(confidence)
    return float((weight * (found["accuracy"] - found["confidence"]).abs()).sum())


def confidence_and_correct(
    logits: torch.Tensor, references: torch.Tensor, multi_label: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prediction's confidence and whether it is right, in float64: the top softmax probability
    and its class against the class id; multi-label (per row and label): max(p, 1 - p) of the sigmoid p
    and whether p >= 0.5 matches the 0/1 target."""
    if multi_label:
        p = logits.double().sigmoid()
        return torch.maximum(p, 1 - p), (p >= 0.5).double() == references.double()
    confidence, predicted = logits.double().softmax(dim=-1).max(dim=-1)
    return confidence, predicted == references


def single_label_calibration(logits: torch.Tensor, references: torch.Tensor) -> dict:
    """`ece` and `brier` (multi-class) of softmax(logits) against class ids."""
    probabilities = logits.double().softmax(dim=-1)
    one_hot = F.one_hot(references.long(), probabilities.shape[-1]).double()
    brier = ((probabilities - one_hot) ** 2).sum(dim=-1).mean() if len(logits) else torch.tensor(0.0)
    return {"ece": ece_of(*confidence_and_correct(logits, references)), "brier": float(brier)}


def multi_label_calibration(logits: torch.Tensor, references: torch.Tensor, names: tuple[str, ...]) -> dict:
    """Each label's sigmoid as a binary problem: `ece_<label>`, `brier_<label>`; `ece`, `brier` the
    means over labels."""
    probabilities, targets = logits.double().sigmoid(), references.double()
    confidence, correct = confidence_and_correct(logits, references, multi_label=True)
    scores, per_label = {}, {m: [] for m in CALIBRATION_METRICS}
    for k, name in enumerate(names):
        p, y = probabilities[:, k], targets[:, k]
        ece = ece_of(confidence[:, k], correct[:, k])
        brier = float(((p - y) ** 2).mean()) if len(p) else 0.0
        scores[f"ece_{name}"], scores[f"brier_{name}"] = ece, brier
        per_label["ece"].append(ece)
        per_label["brier"].append(brier)
    scores.update({m: sum(v) / max(len(v), 1) for m, v in per_label.items()})
    return scores


def negative_log_likelihood(
    logits: torch.Tensor, references: torch.Tensor, temperature: float, multi_label: bool = False
) -> float:
    """Mean NLL of softmax(logits / temperature) over rows, in float64; multi-label: of each label's
    sigmoid(logits / temperature) against its 0/1 target (binary cross-entropy), over rows and labels."""
    if multi_label:
        return float(F.binary_cross_entropy_with_logits(logits.double() / temperature, references.double()))
    return float(F.cross_entropy(logits.double() / temperature, references.long()))


def fit_temperature(logits: torch.Tensor, references: torch.Tensor, multi_label: bool = False) -> float:
    """The temperature T that minimizes the validation NLL of softmax(logits / T) (multi-label: the
    binary NLL of sigmoid(logits / T), one T for every label): a deterministic golden-section search over
    log T within TEMPERATURE_RANGE, on the CPU in float64; 1 when no T lowers the NLL below T = 1's.
    The same logits give the same T bit for bit on every machine that rounds float64 the same way."""
    logits, references = logits.detach().cpu().double(), references.detach().cpu()

    def nll(log_t: float) -> float:
        return negative_log_likelihood(logits, references, math.exp(log_t), multi_label)

    low, high = (math.log(t) for t in TEMPERATURE_RANGE)
    ratio = (math.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    nll_a, nll_b = nll(a), nll(b)
    for _ in range(_SEARCH_STEPS):
        if nll_a <= nll_b:  # the minimum lies in [low, b]
            high, b, nll_b = b, a, nll_a
            a = high - ratio * (high - low)
            nll_a = nll(a)
        else:
            low, a, nll_a = a, b, nll_b
            b = low + ratio * (high - low)
            nll_b = nll(b)
    found = (low + high) / 2
    # A T that does not lower the NLL below T = 1's (all-equal logits: the NLL is flat, and ties walk
    # the search to the lower limit) would rescale the model for nothing: it stays as it is.
    return math.exp(found) if nll(found) < nll(0.0) else 1.0


def temperature_bound(temperature: float) -> str | None:
    """ "upper" or "lower" when `fit_temperature` stopped at that end of TEMPERATURE_RANGE (the search
    ends within 1e-15 of it in log T when the NLL still falls there), else None."""
    low, high = TEMPERATURE_RANGE
    if abs(math.log(temperature / high)) < _AT_BOUND_LOG:
        return "upper"
    if abs(math.log(temperature / low)) < _AT_BOUND_LOG:
        return "lower"
    return None


def cross_fitted_logits(
    logits: torch.Tensor, references: torch.Tensor, multi_label: bool = False, folds: int = 2
) -> tuple[torch.Tensor, list[float]]:
    """The logits with row i in fold i % `folds` and each fold divided by the T fit on the other folds'
    rows; and those temperatures, fold by fold. Calibration figures of the result are held out: no row
    is scored with a T its own label helped fit. Needs at least `folds` rows."""
    if len(logits) < folds:
        raise ValueError(f"cross-fitting {folds} folds needs at least {folds} rows, got {len(logits)}")
    fold = torch.arange(len(logits)) % folds
    scaled, temperatures = torch.empty_like(logits), []
    for k in range(folds):
        temperature = fit_temperature(logits[fold != k], references[fold != k], multi_label)
        scaled[fold == k] = logits[fold == k] / temperature
        temperatures.append(temperature)
    return scaled, temperatures
