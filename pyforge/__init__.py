"""pyforge"""
