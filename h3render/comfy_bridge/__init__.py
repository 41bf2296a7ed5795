"""h3render.comfy_bridge"""
