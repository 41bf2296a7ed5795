"""h3render.worker"""
