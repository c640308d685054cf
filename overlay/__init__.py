"""agiledart.overlay"""
