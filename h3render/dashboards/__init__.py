"""h3render.dashboards: the web dashboard (`h3render dashboard`), a client of h3render.queue.

    app        create_app(settings, redis_conn=..., auth=...): Flask app, rq-dashboard at /rq,
               auth, CSRF and security headers
    security   Auth (token / basic), check_bind (loopback unless auth), per-action CSRF tokens
    rqdash     rq-dashboard under /rq: our templates and script, no pickle, POST-only state changes
    server     waitress (or werkzeug's development server as the fallback)
    views      pages, POST actions (retry, cancel), media files, JSON for live progress
    data       what each page shows, read from Redis and the renders folder
    grid       rows/columns/pages of a sweep's axes (pure)
    charts     health samples -> charts (pure); plots: inline SVG (pure)
    filters    Jinja filters
docs/DASHBOARD.md describes the pages and the safety rules.
"""
