"""Everything around the planner that users run, one subpackage per product.

- ``api.service``: the HTTP service (routes, admission, intake, the plan cache, settings).
- ``api.store``: the plan store (tables, migrations, queries).
- ``api.dashboard``: the solver tuning dashboard (routes, views, static pages).
- ``api.client``: the trainers' client; needs only httpx (the ``client`` extra).
- ``api.cli``: the ``dhp`` command line, the top layer.
- ``api.app`` joins the service and the dashboard into one application; ``api.local_server`` runs it
  in a child process for tests and benchmarks.

Importing this package pulls in nothing: each subpackage imports what it needs.
"""
