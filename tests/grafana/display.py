"""What Grafana shows for a panel's value: the colour its thresholds give it, the text its
value mappings give it; as Grafana's getActiveThreshold and range mappings decide them."""

from __future__ import annotations


def steps(panel: dict) -> list[dict]:
    return panel["fieldConfig"]["defaults"]["thresholds"]["steps"]


def colour_of(panel: dict, value: float) -> str:
    """The colour of the last step ``value`` reaches (the base step, value null, from -inf).

    A fixed colour mode paints every value one colour, whatever the steps say.
    """
    colour = panel["fieldConfig"]["defaults"]["color"]
    if colour["mode"] == "fixed":
        return colour["fixedColor"]
    active = steps(panel)[0]["color"]
    for step in steps(panel)[1:]:
        if value < step["value"]:
            break
        active = step["color"]
    return active


def text_of(panel: dict, value: float) -> str | None:
    """The text of the first range mapping holding ``value`` (ends inclusive, null open)."""
    for mapping in panel["fieldConfig"]["defaults"].get("mappings", []):
        bounds = mapping["options"]
        low, high = bounds["from"], bounds["to"]
        if (low is None or value >= low) and (high is None or value <= high):
            return bounds["result"]["text"]
    return None
