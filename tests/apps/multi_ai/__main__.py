"""``python tests/apps/multi_ai`` (or ``monai-triton exec tests/apps/multi_ai``): start the app the App SDK's way."""

from app import MultiAIApp

if __name__ == "__main__":
    MultiAIApp().run()
