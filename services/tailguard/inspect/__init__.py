"""Seeing what a job did, from its archive: `tailguard timeline`, `explain` and `export`.

The models (`history`, `describe`, `timeline`, `trace`, `explain`) are pure functions of the
archived records, tested on recorded histories; `reading` opens an archive and the `*_cli`
modules and `page`/`export` are the thin shells that read, render and write.
"""
