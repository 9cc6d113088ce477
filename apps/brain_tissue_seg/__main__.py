from app import BrainTissueSegApp

if __name__ == "__main__":
    BrainTissueSegApp().run()
