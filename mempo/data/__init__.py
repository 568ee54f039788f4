"""mempo.data"""
