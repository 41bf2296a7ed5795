"""h3render.queue"""
