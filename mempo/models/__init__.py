"""mempo.models"""
