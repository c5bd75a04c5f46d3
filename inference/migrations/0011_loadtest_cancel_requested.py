# One status vocabulary (issue 29): a load-test run's stop request is named as a package job's is.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0010_loadtest_credentials"),
    ]

    operations = [
        migrations.RenameField(
            model_name="loadtestrun",
            old_name="stop_requested",
            new_name="cancel_requested",
        ),
    ]
