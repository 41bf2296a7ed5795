"""h3render.engine"""
