"""Argument checks shared by the data layer: bad input stops with the field's name."""
import numbers
from typing import Any


def check_int(value: Any, field: str, minimum: int) -> int:
  """`value` as an int >= minimum (bools refused); ValueError naming `field` otherwise."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ValueError(f'{field} must be an int >= {minimum}, got {value!r}')
  if value < minimum:
    raise ValueError(f'{field} must be an int >= {minimum}, got {value}')
  return int(value)
