"""Benchmarks: ``python -m phyai_ros.bench`` (``__main__``), the one entry point docs/benchmarks.md cites.

A checkpoint of any registered family is benched through the adapter contract (``adapter_bench``: load, capture,
predict, the serve engine's rows), timed one way (``timing``) and written as one JSON record (``record``) that
says what made its figures; the full-size benches, the serving bench and the other tools are the scripts in
``scripts/`` (``full_size`` maps the CLI's options to each family script's, ``scripts`` runs them). The top layer
of docs/design.md §1: nothing in the package imports it.
"""
