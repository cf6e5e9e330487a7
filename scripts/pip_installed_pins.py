"""Print `name==version` for every distribution that pip installed in this environment.

Distributions without an INSTALLER record (the metadata that ROS wheels ship for
their inner packages) are skipped, as are the packaging tools themselves.
"""
from importlib import metadata

SKIP = {"pip", "setuptools", "wheel"}


def main() -> None:
    pins = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name.lower() in SKIP or (dist.read_text("INSTALLER") or "").strip() != "pip":
            continue
        version = dist.version.split("+")[0]  # torch 2.13.0+cpu is asked for as 2.13.0
        pins.add(f"{name}=={version}")
    print("\n".join(sorted(pins, key=str.lower)))


if __name__ == "__main__":
    main()
