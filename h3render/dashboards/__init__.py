"""h3render.dashboards"""
