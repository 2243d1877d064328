"""The planning layer: the only code that knows both the engine (:mod:`optimizer`) and the exact
backends (:mod:`solver_models`). It orchestrates one request under one deadline."""
