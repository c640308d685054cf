"""agiledart.recovery"""
