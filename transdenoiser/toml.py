"""TOML reading on every supported Python: the standard library's tomllib (3.11+) or tomli (3.10)."""
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["tomllib"]
