"""Prints constraints.txt: the installed version of every package the project needs.

The closure of pyproject.toml's dependencies and its `test` extra (with the extras that one
names), read from the installed packages' metadata, so unrelated packages on the machine stay
out. Run it in the environment the tests passed in: python .ci/freeze_constraints.py >
constraints.txt
"""
import importlib.metadata
import pathlib
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def project_requirements(extras=("test",)) -> list[Requirement]:
  project = tomllib.loads(PROJECT.read_text())["project"]
  name = canonicalize_name(project["name"])
  pending, seen = list(extras), set()
  requirements = [Requirement(r) for r in project["dependencies"]]
  while pending:
    extra = pending.pop()
    if extra in seen:
      continue
    seen.add(extra)
    for text in project["optional-dependencies"][extra]:
      requirement = Requirement(text)
      if canonicalize_name(requirement.name) == name:  # "fedjax-lama[data]": more extras
        pending.extend(requirement.extras)
      else:
        requirements.append(requirement)
  return requirements


def closure(requirements: list[Requirement]) -> dict[str, str]:
  """{distribution name: installed version} of the requirements and all they require."""
  pinned, pending = {}, [(r, ()) for r in requirements]
  while pending:
    requirement, extras = pending.pop()
    if requirement.marker and not any(
        requirement.marker.evaluate({"extra": e}) for e in (extras or ("",))):
      continue
    key = canonicalize_name(requirement.name)
    try:
      dist = importlib.metadata.distribution(requirement.name)
    except importlib.metadata.PackageNotFoundError:
      sys.exit(f"{requirement.name} is required but not installed: install the project's "
               "test extra first")
    if key in pinned and not requirement.extras:
      continue
    pinned[key] = (dist.metadata["Name"], dist.version)
    for text in dist.requires or ():
      pending.append((Requirement(text), tuple(requirement.extras)))
  return dict(sorted(pinned.values(), key=lambda nv: canonicalize_name(nv[0])))


def main() -> None:
  print("# The exact versions the tests ran with: pip install -c constraints.txt ...")
  print("# Written by .ci/freeze_constraints.py (BUILD.md says how to move it forward).")
  for name, version in closure(project_requirements()).items():
    print(f"{name}=={version}")


if __name__ == "__main__":
  main()
